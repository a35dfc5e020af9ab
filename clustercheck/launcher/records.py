"""The control machine's record of a detached job: which inventory and nodes it runs on and how they were reached,
so `clustercheck logs JOB` and `clustercheck stop JOB` need nothing else. Kept under $XDG_STATE_HOME/clustercheck/
jobs/ (default ~/.local/state/clustercheck/jobs/), one JSON file per job."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path


class RecordError(ValueError):
    """No such job recorded here, or an unreadable record; printed as one line."""


@dataclass(frozen=True)
class JobRecord:
    job: str
    hosts: str  # --hosts as given (an inventory path made absolute)
    limit: str | None
    nodes: list[str]  # in inventory order
    command: list[str]  # what followed --
    started: float
    run_dir: str
    first_ranks: dict[str, int | None] = field(default_factory=dict)  # node -> global rank of its local rank 0
    ssh_config: str | None = None
    known_hosts: list[str] = field(default_factory=list)
    slurm: bool = False  # a Slurm batch job (launch --slurm): JOB is Slurm's id, its output in RUN_DIR


def directory() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "clustercheck" / "jobs"


def save(record: JobRecord) -> Path:
    target = directory() / f"{record.job}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".json.part")
    partial.write_text(json.dumps(asdict(record), indent=2) + "\n")
    partial.replace(target)
    return target


def load(job: str) -> JobRecord:
    path = directory() / f"{job}.json"
    if not path.exists():
        raise RecordError(
            f"no job {job} recorded on this machine ({path.parent}); give --hosts INVENTORY to reach its nodes "
            "(clustercheck jobs --hosts INVENTORY lists them)"
        )
    try:
        return JobRecord(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise RecordError(f"{path}: not a job record ({exc})") from exc
