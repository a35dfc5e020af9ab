"""One frozen run configuration: what the command line asked for, built once (run/verify.py) and passed down; and
the run directory a run or a launch keeps its outputs in."""

from __future__ import annotations

import datetime as dt
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from clustercheck import expected
from clustercheck.checks.baseline import Baseline
from clustercheck.checks.consistency import DEFAULT_MAX_CLOCK_OFFSET
from clustercheck.container import Container
from clustercheck.exitcodes import UsageError
from clustercheck.remote.netprobe import DEFAULT_ROUNDS
from clustercheck.selection import Selection
from clustercheck.transport.params import SshSettings

DEFAULT_MASTER_PORT = 29500  # torchrun's own default


@dataclass(frozen=True)
class RunConfig:
    run_dir: Path
    selection: Selection = field(default_factory=Selection)
    python: str | None = None  # --python: the same environment python on every node
    container: Container | None = None  # --container: torch runs in this image on every node
    forks: int = 32  # hosts handled at once in the core stage
    command_timeout: float = 120.0  # the facts collector
    job_timeout: float = 300.0  # each torch job (node-local collectives, collectives, DDP)
    nproc_per_node: int | None = None
    master_port: int = DEFAULT_MASTER_PORT
    master_port_given: bool = True  # False: --master-port not given, so a one-node run takes a free port instead
    ssh: SshSettings = field(default_factory=SshSettings)
    clock_bound: float = DEFAULT_MAX_CLOCK_OFFSET
    min_busbw: str | None = None  # --min-busbw, else the inventory's clustercheck_min_busbw
    network_duration: float = 10.0  # how long the network probe may try
    network_rounds: int | None = DEFAULT_ROUNDS  # --network-rounds: partners each node is measured with (None: all)
    shared_dir: str | None = None  # --shared-dir: one filesystem on every node (the checkpoint goes there)
    data_paths: tuple[str, ...] = ()  # --data-path, else the inventory's clustercheck_data_paths
    stall_timeout: float = 60.0  # a torch job's ranks silent this long on one node (while others wait): named
    dcgm_level: int | None = None  # --dcgm-level: run dcgmi diag -r LEVEL on nodes that have it
    burn_seconds: float | None = None  # --burn: every GPU under load this long (remote/gpuburn.py), else no burn
    expect_transport: str | None = None  # --expect-transport: ib, roce or socket (else each node's inventory var)
    baseline: Baseline | None = None  # --baseline: the earlier report this run is compared with
    inventory: str | None = None  # --hosts when it is an inventory: the fix commands name it (-i INVENTORY)
    models: expected.Catalog = field(default_factory=expected.shipped)  # expected values per GPU model

    def host_dir(self, name: str) -> Path:
        path = self.run_dir / "hosts" / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def make_run_dir(given: str | None, name: str) -> Path:
    """--run-dir (default ./clustercheck-runs/NAME, NAME a strftime pattern), made and proved writable before
    anything runs: a run directory that cannot be written is a usage error, not a failure half-way."""
    path = Path(given or Path("clustercheck-runs") / dt.datetime.now().strftime(name))
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise UsageError(f"--run-dir {path}: cannot write there ({exc.strerror or exc})") from exc
    return path
