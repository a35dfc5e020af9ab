"""The health program's circuit breaker (pure): whether node-health may drain its node, from what Slurm shows of
every node (`scontrol show node`, read once, only when a drain is due).

A check that fails on many nodes at once (a wrong expected value, an NTP server down, a shared filesystem's hiccup)
is more likely wrong than all those nodes broken, and draining them all would empty the partition. So clustercheck
drains at most Limit.most(N) of a partition's N nodes (a share of them, and at least a number): a node whose drain
would go past that in any of its partitions is not drained; node-health says why, and writes the metric
clustercheck_slurm_drain_withheld that the alert ClustercheckDrainWithheld (monitoring/) fires on. The nodes
counted are those drained with a reason of clustercheck's (drain.py): an administrator's drains are not its.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from clustercheck.slurm.parse import SlurmNode

MAX_DRAINED_PERCENT = 10.0  # default: a tenth of a partition's nodes ...
MAX_DRAINED_NODES = 1  # ... and at least one node


@dataclass(frozen=True)
class Limit:
    """How many of a partition's nodes clustercheck may hold drained: PERCENT of them (rounded down), and at least
    NODES."""

    percent: float = MAX_DRAINED_PERCENT
    nodes: int = MAX_DRAINED_NODES

    def most(self, total: int) -> int:
        return max(self.nodes, math.floor(total * self.percent / 100 + 1e-9))

    def describe(self) -> str:
        return f"{self.percent:g} % of its nodes, at least {self.nodes}"


@dataclass(frozen=True)
class Verdict:
    """Whether NODE may be drained for CHECK; when not, the partition that is full: its NODES, those clustercheck
    holds drained already (DRAINED) and the most it may (MOST)."""

    node: str
    check: str
    drain: bool
    partition: str = ""
    nodes: int = 0
    drained: tuple[str, ...] = ()
    most: int = 0
    limit: Limit = Limit()

    def describe(self) -> str:
        """Why the node was not drained, in one line (for the log and the output)."""
        where = f"partition {self.partition}" if self.partition else "the cluster"
        return (
            f"not draining {self.node} for {self.check}: clustercheck holds {len(self.drained)} of the "
            f"{self.nodes} nodes of {where} drained already ({', '.join(self.drained)}), the most it may "
            f"({self.limit.describe()}); a check failing on this many nodes at once is more likely wrong than the "
            "nodes (a wrong expected value, a shared service down): find the cause, then fix it or raise the limit"
        )


def decide(node: SlurmNode, check: str, nodes: list[SlurmNode], limit: Limit) -> Verdict:
    """Whether NODE (not drained by clustercheck yet) may be drained for CHECK, given every node Slurm shows (NODES)
    and the LIMIT: not when, in one of its partitions, clustercheck holds drained the most it may already."""
    partitions = node.partitions or ("",)  # a node in no partition: the cluster's nodes are its peers
    for partition in partitions:
        peers = [n for n in nodes if not partition or partition in n.partitions]
        if node.name not in {n.name for n in peers}:
            peers.append(node)
        drained = tuple(n.name for n in peers if n.name != node.name and n.drained and n.ours)
        most = limit.most(len(peers))
        if len(drained) + 1 > most:
            return Verdict(node.name, check, False, partition, len(peers), drained, most, limit)
    return Verdict(node.name, check, True, limit=limit)
