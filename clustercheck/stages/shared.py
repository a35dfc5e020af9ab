"""The run's one torch job: the torch stages' work, and the core stage's node-local collectives, as the parts of one
torchrun job over every node (the node side: remote/stages.py). torchrun, each rank's `import torch` and the process
group are paid once per run instead of once per stage.

The pipeline plans the job when the first torch stage is about to run, with the part of every torch stage that will
run after it (each stage module's `part_args`: its part's arguments, or None when the stage cannot take part and
says why itself), and the node-local collectives when the core stage left them to it (`defers_local`). The first
stage that asks for its part starts the job; each stage then judges its own part's records (torchjob.JobOutcome's
`parts`) as it judged its own job's: a part every rank completed is judged on its records whatever happened later
in the job; a part the job did not get through carries the job's failure (the stall the watchdog named, the node
that failed first, the deadline). When the job cannot start, every stage that asks gets the same error.
"""

from __future__ import annotations

import json
import time

from clustercheck.checks import collectives as collective_checks
from clustercheck.model import CheckResult
from clustercheck.selection import DECLARED, Selection
from clustercheck.stages import Context, Member, torchjob

STAGE = "torch"  # the job's directory on the node and in the run directory
WORKER = "stages"  # its program in the node-side bundle
LOCAL = "local"  # the part of the node-local collectives


class SharedJob:
    """The one torch job of a run, with PARTS (part -> its arguments, in the order they run); it runs at the first
    `outcome` asked for, once."""

    def __init__(self, parts: dict[str, list[str]]) -> None:
        self.parts = dict(parts)
        self.started: float | None = None  # when it started (wall clock), once it did
        self._outcome: torchjob.JobOutcome | None = None
        self._error: Exception | None = None

    def outcome(self, part: str, members: list[Member], ctx: Context) -> torchjob.JobOutcome:
        """PART's outcome, the job run first if it has not yet; the job's error when it could not start."""
        if self._outcome is None and self._error is None:
            self.started = time.time()
            try:
                self._outcome = torchjob.run(
                    members,
                    WORKER,
                    ctx,
                    stage=STAGE,
                    worker_args=["--parts", json.dumps(self.parts, separators=(",", ":"))],
                    parts=list(self.parts),
                )
            except Exception as exc:  # the stage asking now reports it; every later one is told the same
                self._error = exc
        if self._error is not None:
            raise self._error
        assert self._outcome is not None
        return self._outcome.parts[part]

    def seconds(self, part: str) -> float | None:
        """How long PART took on its slowest rank (None: no rank recorded it)."""
        if self._outcome is None or part not in self._outcome.parts:
            return None
        times = [r["seconds"] for r in self._outcome.parts[part].records if isinstance(r.get("seconds"), (int, float))]
        return max(times) if times else None

    @property
    def ran(self) -> bool:
        return self._outcome is not None or self._error is not None


def defers_local(hosts: tuple[str, ...], selection: Selection) -> bool:
    """Whether the core stage leaves the node-local collectives to the run's torch job: on a run of several nodes
    where a torch stage is selected (on one node the collectives stage is this very job: localjob.local_collectives)."""
    return len(hosts) > 1 and any(s.needs_torch and selection.stage_selected(s.name) for s in DECLARED)


def local_results(member: Member, part: torchjob.JobOutcome) -> list[CheckResult]:
    """local.* on MEMBER from the job's node-local part: its ranks' records, each numbered within the node (the
    judge counts a node's ranks from 0), judged as the node-local job's own."""
    mine = {rank: i for i, rank in enumerate(part.ranks.get(member.name, []))}
    records = [{**r, "rank": mine[r["rank"]]} for r in part.of_node(member.name) if r["rank"] in mine]
    results = collective_checks.evaluate(records, len(mine), collective_checks.LOCAL_PREFIX, member.name)
    return torchjob.judged(results, part)
