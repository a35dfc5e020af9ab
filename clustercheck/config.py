"""The options clustercheck's commands hand down, declared once, and their defaults, each written once with its
reason: NodeOptions (run and launch), RunOptions (run's, taken by the stages as given), shared by the requests the
commands make (run/verify.py's RunRequest, launcher/start.py's LaunchRequest) and the records built from them (the
frozen RunConfig a run passes down, the launch's LaunchOptions) instead of copied field by field; and the run
directory a run or a launch keeps its outputs in."""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clustercheck import expected
from clustercheck.checks.baseline import Baseline
from clustercheck.checks.consistency import DEFAULT_MAX_CLOCK_OFFSET
from clustercheck.container import Container
from clustercheck.exitcodes import UsageError
from clustercheck.remote.netprobe import DEFAULT_ROUNDS
from clustercheck.remote.pairs import DEFAULT_ROUNDS as PAIR_ROUNDS
from clustercheck.selection import Selection
from clustercheck.transport.params import SshSettings

# The options' defaults, each written here once (--help shows them as written: whole seconds).
DEFAULT_MASTER_PORT = 29500  # torchrun's own default: the port a user's own torchrun jobs use too
DEFAULT_FORKS = 32  # --forks: hosts handled at once in the core stage (a thread and a connection each)
DEFAULT_COMMAND_TIMEOUT = 120  # --command-timeout: the facts collector on a node, with room for a slow node
DEFAULT_JOB_TIMEOUT = 300  # --timeout: each torch job, importing torch and starting NCCL on every node included
DEFAULT_STALL_TIMEOUT = 60  # --stall-timeout: a node's ranks silent this long while the others wait are named
DEFAULT_SLURM_WAIT = 300  # --slurm-wait: Slurm's time to grant the allocation run asks for outside one


@dataclass(frozen=True, kw_only=True)
class NodeOptions:
    """How the torch side runs on every node, as run and launch are asked (--python, --container,
    --nproc-per-node)."""

    python: str | None = None  # --python: the same environment python on every node
    container: Container | None = None  # --container: torch runs in this image on every node
    nproc_per_node: int | None = None  # --nproc-per-node; None: the GPU count, or 2 without GPUs


@dataclass(frozen=True, kw_only=True)
class RunOptions(NodeOptions):
    """The options of `clustercheck run` the stages take as given, declared once: the request has them as the
    command line gave them, the RunConfig the same values (shared() hands them on)."""

    forks: int = DEFAULT_FORKS
    command_timeout: float = float(DEFAULT_COMMAND_TIMEOUT)  # the facts collector
    job_timeout: float = float(DEFAULT_JOB_TIMEOUT)  # --timeout: each torch job (local collectives, collectives, DDP)
    stall_timeout: float = float(DEFAULT_STALL_TIMEOUT)  # a torch job's ranks silent this long on one node: named
    network_rounds: int | None = DEFAULT_ROUNDS  # --network-rounds: partners each node is measured with (None: all)
    pair_rounds: int | None = PAIR_ROUNDS  # --pair-rounds: the fabric's rounds of node pairs (None: all, 0: none)
    min_pair_busbw: float | None = None  # --min-pair-busbw: one rail's send/recv floor between two nodes, GB/s
    clock_bound: float = DEFAULT_MAX_CLOCK_OFFSET  # --max-clock-offset
    shared_dir: str | None = None  # --shared-dir: one filesystem on every node (the checkpoint goes there)
    dcgm_level: int | None = None  # --dcgm-level: run dcgmi diag -r LEVEL on nodes that have it
    burn_seconds: float | None = None  # --burn: every GPU under load this long (remote/gpuburn.py), else no burn
    expect_transport: str | None = None  # --expect-transport: ib, roce or socket (else each node's inventory var)
    baseline: Baseline | None = None  # --baseline: the earlier report this run is compared with


def shared(record: Any, kind: type) -> dict[str, Any]:
    """The fields of KIND (NodeOptions, RunOptions) in RECORD, to build another record that shares them."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(kind)}


@dataclass(frozen=True, kw_only=True)
class RunConfig(RunOptions):
    """One frozen run configuration: run's options (RunOptions), and what was resolved from them before anything
    ran (the run directory, the stages, the nodes' SSH settings, the inventory's values)."""

    run_dir: Path
    selection: Selection = field(default_factory=Selection)
    master_port: int = DEFAULT_MASTER_PORT
    master_port_given: bool = True  # False: --master-port not given, so a one-node run takes a free port instead
    ssh: SshSettings = field(default_factory=SshSettings)
    min_busbw: str | None = None  # --min-busbw, else the inventory's clustercheck_min_busbw
    network_duration: float = 10.0  # how long the network probe may try
    data_paths: tuple[str, ...] = ()  # --data-path, else the inventory's clustercheck_data_paths
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
