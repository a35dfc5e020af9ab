"""The user's job as one torchrun command line per node (pure logic, no I/O).

`clustercheck launch ... -- [TORCHRUN OPTIONS] SCRIPT [ARGS]`: what follows `--` reads as a torchrun command line
without the `torchrun`. clustercheck adds what it knows from the inventory and the facts: --nnodes, --node-rank
in inventory order, the first node's cluster address as master (or as the c10d rendezvous endpoint for elastic
runs), --nproc-per-node, and the interface variables; the user's own torchrun options (--max-restarts,
--rdzv-backend c10d, --nnodes MIN:MAX, ...) pass through.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from clustercheck.stages.launch import LaunchError, NodeLaunch, NodeSpec, inductor_cache, plan_torchrun

# torchrun's options (torch.distributed.run's parser), by whether they take a value.
VALUE_OPTIONS = frozenset(
    {
        "--nnodes",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-endpoint",
        "--rdzv-id",
        "--rdzv-conf",
        "--max-restarts",
        "--monitor-interval",
        "--start-method",
        "--event-log-handler",
        "--role",
        "--log-dir",
        "--redirects",
        "--tee",
        "--local-ranks-filter",
        "--duplicate-stdout-filters",
        "--duplicate-stderr-filters",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--local-addr",
        "--logs-specs",
        "--numa-binding",
        "--signals-to-handle",
        "--shutdown-timeout",
    }
)
FLAGS = frozenset({"--standalone", "--module", "--no-python", "--run-path", "--virtual-local-rank"})
SHORT = {"-m": "--module", "-r": "--redirects", "-t": "--tee"}

# What clustercheck sets itself, and what to use instead.
OWN = {
    "--node-rank": "clustercheck sets it from the inventory order",
    "--master-addr": "clustercheck uses the first node's cluster address",
    "--master-port": "use clustercheck launch --master-port",
    "--nproc-per-node": "use clustercheck launch --nproc-per-node",
    "--standalone": "a launch spans the inventory's nodes",
    "--log-dir": "every rank's output is kept in the run directory",
    "--tee": "every rank's output is streamed with a node/rank prefix",
    "--redirects": "every rank's output is streamed with a node/rank prefix",
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class UserCommand:
    """What follows `--`: the user's torchrun options (as --name=value), the script and its arguments."""

    options: tuple[tuple[str, str | None], ...]
    script: str
    args: tuple[str, ...]

    def option(self, name: str) -> str | None:
        return next((value for opt, value in self.options if opt == name), None)

    def has(self, name: str) -> bool:
        return any(opt == name for opt, _ in self.options)

    @property
    def is_module(self) -> bool:
        """SCRIPT names a module (-m) or a program (--no-python), not a file."""
        return self.has("--module") or self.has("--no-python")

    @property
    def elastic(self) -> bool:
        """A rendezvous backend (c10d) or a node range: the nodes meet at an endpoint, ranks are given out there."""
        backend = self.option("--rdzv-backend")
        return (backend is not None and backend != "static") or ":" in (self.option("--nnodes") or "")


def parse(argv: list[str] | tuple[str, ...]) -> UserCommand:
    """[TORCHRUN OPTIONS] SCRIPT [ARGS] -> UserCommand; LaunchError says what is wrong in one line."""
    options: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        token = argv[i]
        name, eq, inline = token.partition("=")
        if not name.startswith("--"):
            name = SHORT.get(name, name)
        name = "--" + name[2:].replace("_", "-") if name.startswith("--") else name
        if name in OWN:
            raise LaunchError(f"{token}: not allowed after -- ({OWN[name]})")
        if name in FLAGS:
            if eq:
                raise LaunchError(f"{token}: torchrun's {name} takes no value")
            options.append((name, None))
        elif name in VALUE_OPTIONS:
            if eq:
                value = inline
            elif i + 1 < len(argv):
                i += 1
                value = argv[i]
            else:
                raise LaunchError(f"{token}: needs a value")
            options.append((name, value))
        else:
            raise LaunchError(
                f"{token}: not a torchrun option (usage: clustercheck launch --hosts INV -- [TORCHRUN OPTIONS] "
                "SCRIPT [ARGS])"
            )
        i += 1
    if i >= len(argv) or not argv[i].strip():
        raise LaunchError("no script to launch (usage: clustercheck launch --hosts INV -- train.py [ARGS])")
    return UserCommand(tuple(options), argv[i], tuple(argv[i + 1 :]))


def script_problem(command: UserCommand, base: str) -> tuple[str, bool] | None:
    """What is wrong with COMMAND's script, read on this machine where the job will find it (BASE: the directory a
    relative path is taken from): (why, whether it is missing, not broken), or None for a script that compiles, a
    module (-m, --no-python) or a file that is no .py. Found here in a moment, not on every node after the
    preflight and torchrun's start."""
    if command.is_module or not command.script.endswith(".py"):
        return None
    path = posixpath.join(base, posixpath.expanduser(command.script))
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except FileNotFoundError:
        return f"{command.script}: no such file (in {base})", True
    except OSError as exc:
        return f"{command.script}: cannot be read ({exc.strerror or exc})", True
    try:
        compile(source, command.script, "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename or command.script}:{exc.lineno}" if exc.lineno else command.script
        return f"{where}: {type(exc).__name__}: {exc.msg}: every rank would fail on it; fix it first", False
    except ValueError as exc:  # source with null bytes
        return f"{command.script}: not Python source ({exc})", False
    return None


def parse_env(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """--env K=V (repeatable) -> {K: V}."""
    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not ENV_NAME.match(key):
            raise LaunchError(f"--env {pair}: expected NAME=VALUE")
        env[key] = value
    return env


def check_nnodes(command: UserCommand, count: int) -> str:
    """The --nnodes to give torchrun: the node count, or the user's MIN:MAX when it admits COUNT nodes."""
    given = command.option("--nnodes")
    if given is None:
        return str(count)
    low, colon, high = given.partition(":")
    try:
        lo, hi = int(low), int(high) if colon else int(low)
    except ValueError:
        raise LaunchError(f"--nnodes {given}: expected N or MIN:MAX") from None
    if not 1 <= lo <= hi:
        raise LaunchError(f"--nnodes {given}: expected 1 <= MIN <= MAX")
    if not colon and lo != count:
        raise LaunchError(f"--nnodes {given}: the inventory has {count} node(s); use MIN:MAX for an elastic run")
    if not lo <= count <= hi:
        raise LaunchError(f"--nnodes {given}: the inventory has {count} node(s), outside {lo}..{hi}")
    return given


def job_env(
    backend: str, interface: str | None, extra: dict[str, str] | None = None, *, job_dir: str | None = None
) -> dict[str, str]:
    """The job's environment: the cluster interface for NCCL and Gloo, output unbuffered, torch's compile cache in
    the job's directory on the node (JOB_DIR), the user's --env last."""
    env = {"PYTHONUNBUFFERED": "1"}
    if job_dir:
        env["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache(job_dir)
    if interface:
        env["NCCL_SOCKET_IFNAME"] = interface
        env["GLOO_SOCKET_IFNAME"] = interface
    if backend == "nccl":
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"  # a dead peer ends the job instead of hanging it
    env.update(extra or {})
    return env


def plan(
    nodes: list[NodeSpec],
    command: UserCommand,
    *,
    job_id: str,
    master_port: int,
    interfaces: dict[str, str | None],
    log_dirs: dict[str, str],
    job_dirs: dict[str, str] | None = None,
    nproc_override: int | None = None,
    env: dict[str, str] | None = None,
    script: str | None = None,
) -> list[NodeLaunch]:
    """One NodeLaunch per node (stages/launch.py's planner), node rank in inventory order, the first node the
    master. LOG_DIRS: node -> where torchrun keeps its per-rank logs there; JOB_DIRS: node -> the job's own
    directory there, which holds torch's compile cache; SCRIPT replaces the user's script path (a synced copy)."""
    if not nodes:
        raise LaunchError("no nodes to launch on")
    if not 1024 <= master_port <= 65535:
        raise LaunchError(f"--master-port {master_port}: expected 1024..65535")
    rendezvous = None
    if command.elastic:
        endpoint = f"{nodes[0].address}:{master_port}"
        rendezvous = [
            f"--{name}={value}"
            for name, value in (("rdzv-backend", "c10d"), ("rdzv-endpoint", endpoint), ("rdzv-id", job_id))
            if not command.has(f"--{name}")
        ]
    script = script or command.script
    return plan_torchrun(
        nodes,
        program=lambda node: [script, *command.args],
        master_port=master_port,
        log_dir=lambda node: log_dirs[node.name],
        env=lambda node, backend: job_env(
            backend, interfaces.get(node.name), env, job_dir=(job_dirs or {}).get(node.name)
        ),
        options=[
            f"{name}={value}" if value is not None else name for name, value in command.options if name != "--nnodes"
        ],
        nproc_override=nproc_override,
        nnodes=check_nnodes(command, len(nodes)),
        rendezvous=rendezvous,
        # in a container: the job works where it would on the node, and its script's directory is there too
        mounts=lambda node: [posixpath.dirname(script)] if posixpath.isabs(script) and not command.is_module else [],
        here=True,
    )


def first_ranks(launches: list[NodeLaunch], elastic: bool) -> dict[str, int | None]:
    """Node -> the global rank of its local rank 0 (None in an elastic run, where the rendezvous decides)."""
    out: dict[str, int | None] = {}
    total = 0
    for launch in launches:
        out[launch.node.name] = None if elastic else total
        total += launch.nproc
    return out
