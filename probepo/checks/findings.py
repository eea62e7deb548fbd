"""What a check found, and the refusal of a run that fails one. Standard library only: the credentials
check's child interpreter imports it (checks/credentials.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


class Refused(ValueError):
    """A run that would fail in its jobs: `problems`, one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass
class Findings:
    """What a check found: `failures` (each one line: what, and how to fix it), `warnings` (it may run, but
    read this) and `passed` (what was checked and found in order, with its figures)."""

    failures: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> Findings:
        self.failures += other.failures
        self.warnings += other.warnings
        self.passed += other.passed
        return self

    def refuse(self) -> None:
        """Raise Refused naming every failure, if any."""
        if self.failures:
            raise Refused(self.failures)
