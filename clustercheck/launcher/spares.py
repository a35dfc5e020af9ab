"""`launch --slurm --spare K`: which of the allocation's nodes the job runs on, decided from the preflight's results
(pure; the preflight is preflight.py, the drain and the job shrunk are slurm/update.py and slurm/allocation.py).

The allocation holds the N nodes the job runs on and K spares. A node with a FAIL or ERROR of its own (the result's
host is the node) is left out; the job runs on the first N healthy nodes in the allocation's order, and a healthy
node beyond them is a spare not needed. A problem that names no single node of the allocation cannot be left out
with a node: the launch is refused then, as without spares (unplaced).
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.model import CheckResult
from clustercheck.slurm.diagnose import shown
from clustercheck.slurm.parse import SlurmNode


@dataclass(frozen=True)
class LeftOut:
    """A node the job does not run on: its first problem's CHECK, MESSAGE and FIX; no CHECK: a healthy spare."""

    node: str
    check: str = ""
    message: str = ""
    fix: str = ""

    @property
    def failing(self) -> bool:
        return bool(self.check)

    def line(self) -> str:
        """Why the node was left out, in one line."""
        if not self.failing:
            return f"left out {self.node}: spare, not needed"
        fix = f"; fix: {self.fix}" if self.fix else ""
        return f"left out {self.node}: {self.check}: {self.message}{fix}"


@dataclass(frozen=True)
class Choice:
    """The nodes the job runs on (KEPT, in the allocation's order) and those it does not (LEFT_OUT, in that order);
    WANTED: how many the job needs."""

    kept: tuple[str, ...]
    left_out: tuple[LeftOut, ...]
    wanted: int

    @property
    def enough(self) -> bool:
        return len(self.kept) == self.wanted

    @property
    def failing(self) -> tuple[LeftOut, ...]:
        return tuple(n for n in self.left_out if n.failing)

    def refusal(self) -> str:
        """Why nothing starts (not enough healthy nodes), in one line naming each failing node with its check."""
        total = len(self.kept) + len(self.left_out)
        named = ", ".join(f"{n.node} ({n.check})" for n in self.failing)
        return (
            f"{len(self.kept)} of the {total} nodes are healthy, the job needs {self.wanted}: nothing was started; "
            f"failing: {named}"
        )


def unplaced(results: list[CheckResult], order: list[str]) -> list[CheckResult]:
    """The problems (FAIL, ERROR) in RESULTS that name no single node of ORDER: no node can be left out for them."""
    return [r for r in results if r.status.is_problem and r.host not in order]


def choose(results: list[CheckResult], order: list[str], wanted: int) -> Choice:
    """The nodes of ORDER (the allocation's, in its order) the job runs on: the first WANTED of those with no
    problem of their own in RESULTS; each other node left out with its first problem, or as a spare not needed.
    Fewer than WANTED healthy: every healthy node is kept, and the Choice is not enough."""
    problems = problems_by_node(results, order)
    kept = tuple([name for name in order if not problems[name]][:wanted])
    left_out = []
    for name in order:
        if name in kept:
            continue
        if not problems[name]:
            left_out.append(LeftOut(name))
            continue
        problem = problems[name][0]
        message = problem.message.removeprefix(f"{name}: ")  # the line names the node already
        left_out.append(LeftOut(name, problem.name, message, problem.remediation))
    return Choice(kept, tuple(left_out), wanted)


def problems_by_node(results: list[CheckResult], nodes: list[str]) -> dict[str, list[CheckResult]]:
    """Each of NODES with its own problems in RESULTS (what its drain reason is made of), in RESULTS' order."""
    return {name: [r for r in results if r.status.is_problem and r.host == name] for name in nodes}


def in_partition(nodes: list[SlurmNode], partition: str | None) -> list[SlurmNode]:
    """The nodes of PARTITION (every node when None: the default partition is not in a node's record)."""
    return [n for n in nodes if partition is None or not n.partitions or partition in n.partitions]


def unavailable(nodes: list[SlurmNode], partition: str | None, allocated: list[str]) -> list[SlurmNode]:
    """The nodes of PARTITION Slurm cannot give a job: drained, down, failing or reserved (SlurmNode.unusable, the
    judgement run --slurm's request is read with too), and not among the ALLOCATED."""
    return [n for n in in_partition(nodes, partition) if n.name not in allocated and n.unusable]


def asked(wanted: int, spare: int, nodes: list[SlurmNode], partition: str | None) -> tuple[int, int | None, str]:
    """What a batch job of WANTED nodes and SPARE spares asks Slurm for, its nodes (NODES: Slurm's) read first: N+K
    exactly while the partition has that many usable nodes (a range would let Slurm start the job on N alone, with
    no spare left to absorb a node the preflight fails); fewer usable, N to N+K (Slurm's own minimum and maximum),
    so that a drained or down node costs a spare instead of the job's start. Returns (nodes, maximum or None, a line
    naming the unusable nodes with Slurm's state and reason, or "")."""
    missing = unavailable(nodes, partition, [])
    usable = len(in_partition(nodes, partition)) - len(missing)
    if usable >= wanted + spare:
        return wanted + spare, None, ""
    named = "; ".join(f"{n.name}: {shown(n)}" for n in missing)
    where = f"partition {partition}" if partition else "the cluster"
    said = f"{usable} usable node(s) in {where} for {wanted} and {spare} spare(s): {named or 'none unusable'}"
    if usable < wanted:
        said += f"; the job needs {wanted}, so it waits for Slurm"
    return wanted, wanted + spare, said


def shortfall(granted: int, wanted: int, spare: int, missing: list[SlurmNode] | str) -> str:
    """One line for a batch job Slurm granted fewer spares than asked: how many, and each node it could not give
    with Slurm's state and reason (MISSING; a str: why they could not be read)."""
    got = granted - wanted
    head = f"Slurm granted {granted} node(s) of the {wanted}-{wanted + spare} asked: {got} of {spare} spare(s)"
    if isinstance(missing, str):
        return f"{head}; the partition's other nodes could not be read ({missing})"
    if not missing:
        return f"{head}; no node of the partition is drained or down (the others run other jobs)"
    named = "; ".join(f"{n.name}: {shown(n)}" for n in missing)
    return f"{head}; unavailable: {named}"
