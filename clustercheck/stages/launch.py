"""The one planner of torchrun command lines, for the torch stages and for `clustercheck launch` (pure logic, no
I/O), and the commands that read a torch job's records and heartbeats back.

Static rendezvous: every node is told the number of nodes, its own rank, and the first node's cluster
address and port, as `torchrun --nnodes N --node-rank R --master-addr A --master-port P`; an elastic launch
gives the rendezvous options instead. A torch stage's worker is a program of the node-side bundle
(stages/bundle.py), uploaded into RUN_DIR on each node; torchrun runs the bundle as its script with the
program's name as the first argument (`plan`). The user's own script is planned by launcher/command.py on the
same planner (`plan_torchrun`).
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from clustercheck.container import Container
from clustercheck.remote.rankcollect import LOGS_LINE
from clustercheck.stages import bundle

CPU_RANKS_PER_NODE = 2  # ranks on a node without GPUs, unless the user says otherwise


class LaunchError(ValueError):
    """A launch that cannot work as asked (no nodes, a bad port); printed as one line. FIX, where the cause has its
    own, is what the torch stages give as the remediation of their ERROR (None: the check's declared fix)."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.fix = fix


def launch_fix(exc: Exception) -> str | None:
    """The remediation of a torch stage that could not start for EXC: a LaunchError's own fix, else None (the
    check's declared fix)."""
    return exc.fix if isinstance(exc, LaunchError) else None


@dataclass(frozen=True)
class NodeSpec:
    """What the launch needs to know about one node."""

    name: str  # the inventory name, used in reports
    address: str  # the node's address on the cluster network
    gpus: int  # GPUs torch sees on the node (0 without GPUs)
    python: str  # the environment's python, with torch
    run_dir: str  # per-run directory on the node; the worker and its outputs live under it
    container: Container | None = None  # torchrun runs inside this image (its python is PYTHON)


@dataclass(frozen=True)
class NodeLaunch:
    node: NodeSpec
    node_rank: int
    nproc: int
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        """The command as one shell line (env assignments first), for logs and SSH exec."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join(["env", *assignments, *map(shlex.quote, self.command)])


def choose_backend(gpu_counts: list[int]) -> str:
    """nccl when every node has GPUs, gloo otherwise (one CPU-only node forces gloo for all)."""
    return "nccl" if gpu_counts and all(g > 0 for g in gpu_counts) else "gloo"


def ranks_per_node(gpus: int, backend: str, override: int | None = None, cpu_ranks: int = CPU_RANKS_PER_NODE) -> int:
    """The GPU count with nccl (one rank per GPU), CPU_RANKS_PER_NODE with gloo, or the user's number."""
    if override is not None:
        if override < 1:
            raise LaunchError(f"ranks per node must be at least 1, not {override}")
        return override
    return gpus if backend == "nccl" else cpu_ranks


def output_dir(run_dir: str, stage: str) -> str:
    return f"{run_dir.rstrip('/')}/{stage}"


def inductor_cache(job_dir: str) -> str:
    """Where a torch job's compile cache goes: inside its own directory on the node. torch makes the cache
    directory on importing torch.optim (torch._dynamo), by default $TMPDIR/torchinductor_<user>, which every job
    would leave behind."""
    return f"{job_dir.rstrip('/')}/torchinductor"


def torchrun_env(
    backend: str, interface: str | None, run_dir: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """Environment for torchrun: the cluster interface for NCCL and Gloo, NCCL's INFO log and torch's compile
    cache kept in the run dir."""
    env = {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_FILE": f"{run_dir.rstrip('/')}/nccl-%h-%p.log",
        "TORCHINDUCTOR_CACHE_DIR": inductor_cache(run_dir),
        # One thread per rank: ranks share the node's cores, and oversubscription makes timings noise.
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if interface:
        env["NCCL_SOCKET_IFNAME"] = interface
        env["GLOO_SOCKET_IFNAME"] = interface
    if backend == "nccl":
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # a dead peer ends the job instead of hanging it
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # needed by torch.use_deterministic_algorithms on CUDA
    env.update(extra or {})
    return env


def plan_torchrun(
    nodes: list[NodeSpec],
    *,
    program: Callable[[NodeSpec], list[str]],
    master_port: int,
    log_dir: Callable[[NodeSpec], str],
    env: Callable[[NodeSpec, str], dict[str, str]],
    options: list[str] | tuple[str, ...] = (),
    backend: str | None = None,
    nproc_override: int | None = None,
    cpu_ranks: int = CPU_RANKS_PER_NODE,
    nnodes: str | None = None,
    rendezvous: list[str] | None = None,
    mounts: Callable[[NodeSpec], list[str]] | None = None,
    here: bool = False,
) -> list[NodeLaunch]:
    """The one planner of torchrun command lines (the torch stages' and `clustercheck launch`'s): one NodeLaunch
    per node, node rank in inventory order, the first node the master.

    PROGRAM(node): the script torchrun runs there and its arguments; LOG_DIR(node): where torchrun keeps the
    per-rank logs there; ENV(node, backend): the node's environment. OPTIONS: further torchrun options, as
    --name=value. NNODES: torchrun's --nnodes (default: the node count). RENDEZVOUS: the elastic rendezvous
    options (c10d at an endpoint), given instead of the static node rank and master. On a node with a container
    (NodeSpec.container), torchrun runs inside it, the log directory and MOUNTS(node) mounted, working in the run
    directory, or with HERE in the directory the command starts in.
    """
    if not nodes:
        raise LaunchError("no nodes to launch on")
    if not 1 <= master_port <= 65535:
        raise LaunchError(f"master port {master_port} is not a TCP port")
    backend = backend or choose_backend([n.gpus for n in nodes])
    master = nodes[0].address
    launches = []
    for node_rank, node in enumerate(nodes):
        nproc = ranks_per_node(node.gpus, backend, nproc_override, cpu_ranks)
        if backend == "nccl" and nproc > node.gpus:
            raise LaunchError(
                f"{node.name}: {nproc} ranks per node asked for, but it has {node.gpus} GPU(s)",
                fix=f"NCCL gives every rank a GPU of its own: ask for at most {node.gpus} rank(s) per node "
                "(--nproc-per-node), or leave the option out for one rank per GPU.",
            )
        argv = [
            node.python,  # torchrun through the node's environment python, so that python picks the torch
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes or len(nodes)}",
            f"--nproc-per-node={nproc}",
        ]
        if rendezvous is not None:
            argv += rendezvous
        else:
            argv += [f"--node-rank={node_rank}", f"--master-addr={master}", f"--master-port={master_port}"]
        argv += [*options, f"--log-dir={log_dir(node)}", "--tee=3", *program(node)]
        environment = env(node, backend)
        if node.container is not None:
            argv = node.container.run(
                argv,
                workdir=node.run_dir,
                gpus=node.gpus > 0,
                env=tuple(sorted(environment)),
                mounts=(log_dir(node), *(mounts(node) if mounts else ())),
                here=here,
            )
        launches.append(NodeLaunch(node, node_rank, nproc, argv, environment))
    return launches


def plan(
    nodes: list[NodeSpec],
    *,
    worker: str,
    stage: str,
    master_port: int,
    interface: str | None,
    worker_args: list[str] | None = None,
    nproc_override: int | None = None,
    cpu_ranks: int = CPU_RANKS_PER_NODE,
    backend: str | None = None,
    extra_env: dict[str, dict[str, str]] | None = None,
) -> list[NodeLaunch]:
    """A torch stage's job: WORKER, a program of the node-side bundle, under torchrun on every node (plan_torchrun).

    The worker gets `--out RUN_DIR/STAGE --backend BACKEND` followed by WORKER_ARGS. EXTRA_ENV maps a node
    name to environment variables for that node only.
    """
    backend = backend or choose_backend([n.gpus for n in nodes])
    launches = plan_torchrun(
        nodes,
        program=lambda node: [
            bundle.path(node.run_dir),
            worker,
            *("--out", output_dir(node.run_dir, stage), "--backend", backend),
            *(worker_args or []),
        ],
        master_port=master_port,
        # Every rank's stdout/stderr (NCCL_DEBUG output included) kept on the node.
        log_dir=lambda node: f"{output_dir(node.run_dir, stage)}/torchrun-logs",
        env=lambda node, backend: torchrun_env(backend, interface, node.run_dir, (extra_env or {}).get(node.name)),
        options=["--max-restarts=0", "--redirects=3"],  # a failed rank is a finding, not something to retry
        backend=backend,
        nproc_override=nproc_override,
        cpu_ranks=cpu_ranks,
    )
    return [  # a container's torchrun works in the run directory already
        each
        if each.node.container
        else replace(each, command=["sh", "-c", IN_RUN_DIR, "sh", each.node.run_dir, *each.command])
        for each in launches
    ]


# sh -c IN_RUN_DIR sh DIRECTORY COMMAND...: COMMAND working in DIRECTORY. `python -m torch.distributed.run` puts its
# working directory first on sys.path, where a user's cuda.py (in the directory clustercheck was started from, or
# the home directory over SSH) would shadow a module torch imports; the run directory holds only the bundle.
IN_RUN_DIR = 'cd "$1" || exit 125; shift; exec "$@"'


def world_size(launches: list[NodeLaunch]) -> int:
    return sum(launch.nproc for launch in launches)


def ranks_by_node(launches: list[NodeLaunch]) -> dict[str, list[int]]:
    """Node -> the global ranks its torchrun runs: torchrun numbers the ranks node after node in node-rank order
    (each agent's first rank is the sum of the ranks of the nodes before it)."""
    ranks, first = {}, 0
    for launch in sorted(launches, key=lambda p: p.node_rank):
        ranks[launch.node.name] = list(range(first, first + launch.nproc))
        first += launch.nproc
    return ranks


def collect_command(python: str, run_dir: str, stage: str) -> list[str]:
    """The command that prints the rank records a node's torchrun left in RUN_DIR/STAGE (and in its parts' own
    directories, RUN_DIR/STAGE/<part>: remote/stages.py), and the stage's logs (parse_collected):
    remote/rankcollect.py."""
    return [python, "-c", bundle.source("rankcollect"), output_dir(run_dir, stage)]


def progress_command(python: str, run_dir: str, stage: str, sockets: bool = False) -> list[str]:
    """The command that prints every rank's heartbeat on a node: rank -> {step, phase, age in seconds}, the age
    measured on the node's own clock (`heartbeats`): remote/heartbeats.py. SOCKETS: with each rank's TCP rows."""
    return [python, "-c", bundle.source("heartbeats"), output_dir(run_dir, stage), *(["--sockets"] if sockets else [])]


def heartbeats(answer: object) -> dict[str, dict] | None:
    """progress_command's ANSWER (its JSON, nodeprogram's), or None when it is not one."""
    if not isinstance(answer, dict) or not all(isinstance(b, dict) for b in answer.values()):
        return None
    return answer


def parse_collected(stdout: str) -> tuple[list[dict], bytes | None]:
    """Rank records and the logs archive from collect_command's output (None: no archive line, or not base64; an
    archive cut short is returned as it came, and torchjob.keep_files keeps what it can read of it); a truncated
    record (a rank killed mid-write) is left out, so the judge reports that rank as missing."""
    text, marker, logs = stdout.partition(LOGS_LINE)
    lines = [line for line in text.splitlines() if line.strip()]
    try:  # one document: its records share their keys' strings (json's memo), the controller holds each key once
        parsed = json.loads("[" + ",".join(lines) + "]")  # per node, not once per record (nodes x ranks x parts)
    except ValueError:  # a line that is not JSON (a truncated record, a stray print): each line on its own
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except ValueError:
                continue
    records = [record for record in parsed if isinstance(record, dict) and "rank" in record]
    try:
        archive = base64.b64decode(logs.strip(), validate=True) if marker else None
    except ValueError:
        archive = None
    return records, archive
