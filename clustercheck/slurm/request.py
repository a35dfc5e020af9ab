"""What to ask Slurm for outside an allocation: `run --slurm`'s allocation (salloc) and `launch --slurm`'s batch job
(sbatch) take the same --nodes, --nodelist, --partition, --account and --time."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Request:
    """The nodes (--nodes N or --nodelist NODES), and --partition, --account, --time as given (None where not).
    NODES_MAX: Slurm may grant up to that many nodes, at least NODES (launch --spare: N to N+K, Slurm's own
    minimum and maximum, so that a drained or down node costs a spare instead of the job)."""

    nodes: int | None = None
    nodelist: str | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    nodes_max: int | None = None

    @property
    def given(self) -> list[str]:
        """The options given a value, as the command line spells them: --nodes, --partition, ..."""
        return [f"--{name}" for name, value in self._asked().items() if value is not None]

    @property
    def names_nodes(self) -> bool:
        """Whether it says which nodes, or how many: a request Slurm can be asked."""
        return bool(self.nodes or self.nodelist)

    def options(self) -> list[str]:
        """salloc's and sbatch's options: --nodes=3 (--nodes=2-3 with NODES_MAX), --partition=gpu, ..."""
        return [f"--{name}={value}" for name, value in self._asked().items() if value is not None]

    def _asked(self) -> dict[str, object]:
        asked = asdict(self)
        del asked["nodes_max"]
        if self.nodes and self.nodes_max and self.nodes_max > self.nodes:
            asked["nodes"] = f"{self.nodes}-{self.nodes_max}"
        return asked
