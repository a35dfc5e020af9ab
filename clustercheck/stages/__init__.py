"""The stages of `clustercheck run`, in the order clustercheck/selection.py declares them: core (per node), then
the multi-node stages over every node at once. Each multi-node stage is one module, named as its stage and listed in
MODULES at the end of this file, with one interface:

    NAME: str               the stage's name (--only/--skip take it)
    run(members, ctx) -> list[CheckResult]

and a torch stage also

    part_args(members, ctx) -> list[str] | None
                            its part's arguments in the run's one torch job (stages/shared.py), or None when it
                            cannot take part (its run says why, without the job)

Whether a stage needs torch and whether its failure stops the stages after it are declared with the stage
(selection.DECLARED). The checks each stage emits are declared in the check registry under their stage; the
pipeline (clustercheck/run/multinode.py) reports them as SKIP, in the shape a run gives, when the stage does not run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from clustercheck.config import RunConfig
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.reach import Reach
from clustercheck.transport import Transport

if TYPE_CHECKING:
    from clustercheck.stages.shared import SharedJob

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
    reach: Reach  # how commands reach the nodes (reach.py)
    torch_job: SharedJob | None = None  # the run's one torch job, for the torch stages (stages/shared.py)


# The multi-node stage modules, in the order they run (selection.DISTRIBUTED; a test keeps the two the same).
# Imported here, after Context and Member, which they import from this package. Eager: together they add about
# 15 ms to the command line's start (python -X importtime), which imports network and collectives already.
from clustercheck.stages import collectives, data, ddp, lightning, network  # noqa: E402

MODULES = (network, data, collectives, ddp, lightning)


def modules() -> dict:
    """Stage name -> its module, for the multi-node stages."""
    return {module.NAME: module for module in MODULES}
