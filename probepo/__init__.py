"""ProbePO: sparse probes and redistributed credit for critic-free RL on LLM reasoning."""

__version__ = "0.1.0"
