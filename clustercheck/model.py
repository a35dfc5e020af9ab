"""The check model: every check has one outcome, a one-line message, a remediation and data; a result carries its
stage, and a SKIP why it judged nothing (Skip), as data the reports read."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"
    ERROR = "ERROR"  # the check itself could not run

    @property
    def is_problem(self) -> bool:
        return self in (Status.FAIL, Status.ERROR)


@dataclass(frozen=True)
class Metric:
    """A measured quantity the metrics outputs carry: its name with its unit (Prometheus' naming, without the
    clustercheck_ prefix), the unit alone and what it is. Declared once, next to the check that measures it."""

    name: str  # e.g. network_rtt_seconds
    unit: str  # seconds, bytes, bytes_per_second, ratio, or "" for a plain number
    help: str

    def of(self, value: Any, **labels: str) -> tuple[Measure, ...]:
        """VALUE measured, as a one-element tuple; none when VALUE is not a finite number (not measured)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return ()
        return (Measure(self, float(value), labels),)


@dataclass(frozen=True)
class Measure:
    """One measured value of a check, typed: which metric, the value in the metric's unit, and its labels (the
    host it belongs to, a peer, a message size)."""

    metric: Metric
    value: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Skip:
    """Why a result is SKIP: the reason in words (without the host or the check's name, so the same reason on many
    hosts is one), and the options that left the check out when options did, as the command line takes them
    (`--only core`, `--skip gpu.*`): what a run without them would verify."""

    reason: str
    deselected_by: str | None = None

    @classmethod
    def deselected(cls, options: str) -> Skip:
        """Left out by OPTIONS (`--skip ddp`)."""
        return cls(f"not selected ({options})", options)


def skipped_message(name: str, reason: str, host: str | None = None, *, ran: bool = False) -> str:
    """The message of check NAME skipped on HOST (None: the cluster) for REASON: the one place a SKIP is worded,
    the host put in front once (REASON names neither, see Skip). A check that RAN and judged nothing says its
    reason alone; one that did not run says `NAME skipped: REASON`."""
    text = reason if ran else f"{name} skipped: {reason}"
    return f"{host}: {text}" if host else text


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome on one host (or the cluster). Frozen: a result is made once, never edited; a stage
    that must say more makes a new one."""

    name: str
    status: Status
    message: str
    host: str | None = None  # None for a cluster-wide check
    remediation: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    measures: tuple[Measure, ...] = ()  # its measured values, typed (the JSON report carries data, as before)
    fix_command: str | None = None  # the setup line that puts it right on the nodes it names (checks/setup_roles.py)
    stage: str | None = None  # the stage that reports the check (selection.STAGES); the registry sets it
    skip: Skip | None = None  # a SKIP's reason; the registry sets it (a SKIP made by hand: its message)

    def __post_init__(self) -> None:
        if self.status is not Status.SKIP:
            object.__setattr__(self, "skip", None)  # only a SKIP has a reason to skip
        elif self.skip is None:
            object.__setattr__(self, "skip", Skip(self.message))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "host": self.host,
            "status": self.status.value,
            "message": self.message,
            "remediation": self.remediation,
            "data": self.data,
        }
        if self.fix_command is not None:
            out["fix_command"] = self.fix_command
        if self.stage is not None:
            out["stage"] = self.stage
        if self.skip is not None:
            out["skip_reason"] = self.skip.reason
            if self.skip.deselected_by is not None:
                out["deselected_by"] = self.skip.deselected_by
        return out


def overall_status(results: list[CheckResult]) -> Status:
    """FAIL when any check failed or errored, WARN when any warned, else PASS."""
    if any(r.status.is_problem for r in results):
        return Status.FAIL
    if any(r.status is Status.WARN for r in results):
        return Status.WARN
    return Status.PASS
