"""The stages of `clustercheck run`, in order: core (per node), then network, collectives and ddp over every node
at once. Each multi-node stage is one module with one interface:

    NAME: str               the stage's name (--only/--skip take it)
    NEEDS_TORCH: bool       whether it starts torch (it then skips when torch does not import on a node)
    run(members, ctx) -> list[CheckResult]

The checks each stage emits are declared in the check registry under their stage; the pipeline
(clustercheck/run/pipeline.py) reports them as SKIP, in the shape a run gives, when the stage does not run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from clustercheck.config import RunConfig
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.run.selection import STAGES
from clustercheck.transport import Transport

DISTRIBUTED = STAGES[1:]

Progress = Callable[[str, str], None]


@dataclass
class Member:
    """A node taking part in a multi-node stage."""

    node: Node
    transport: Transport
    facts: NodeFacts
    address: str  # its address on the cluster network
    interface: str | None
    hostname: str | None
    gpus: int

    @property
    def name(self) -> str:
        return self.node.name


@dataclass(frozen=True)
class Context:
    config: RunConfig
    progress: Progress
    hosts: tuple[str, ...]  # every node of the run, in inventory order


def modules() -> dict:
    """Stage name -> its module, for the multi-node stages."""
    from clustercheck.stages import collectives, data, ddp, lightning, network

    return {"network": network, "data": data, "collectives": collectives, "ddp": ddp, "lightning": lightning}
