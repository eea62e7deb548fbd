"""Suite-wide settings: one torch thread per process (measured faster than 2 under load), deterministic."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch

torch.set_num_threads(1)
