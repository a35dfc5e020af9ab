"""The multi-node stages of `clustercheck run`: network, then collectives, then DDP equivalence.

They run after the per-node phase, over every node at once, through the transports the per-node phase
opened. Each stage runs only when the one before it did not fail; a stage that does not run gives SKIP
results saying why. The torch stages start torchrun on every node concurrently under one deadline: when a
node's torchrun fails or the deadline passes, every node's processes of the run are killed (the run-marker
sweep), and the report names the first node that failed with its last error lines.

The judging is pure (network.py, collectives.py, bandwidth.py, ddp.py); the command lines come from
launch.py; this module only moves files and runs commands.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from clustercheck import bandwidth, collectives, ddp, launch, network
from clustercheck.checks import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.transport import CommandResult, Transport, TransportError

STAGES = ("core", "network", "collectives", "ddp")  # in the order they run; core always runs (facts)
DISTRIBUTED = STAGES[1:]
NAMES = {
    "network": ("network.tcp", "network.resolve", "network.mtu", "network.master_port"),
    "collectives": (*collectives.COLLECTIVES, "allreduce.bandwidth"),
    "ddp": (ddp.NAME,),
}
FAILURE_GRACE = 5.0  # seconds the other nodes get to report their own failure before they are stopped
ERROR_LINES = 6


@dataclass
class Member:
    """A node taking part in the multi-node stages."""

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


@dataclass
class StageOptions:
    local_dir: Path  # the local run directory
    stages: tuple[str, ...] = DISTRIBUTED
    master_port: int = 29500
    nproc_per_node: int | None = None
    timeout: float = 300.0  # deadline of each torch job
    min_busbw: str | None = None
    network_duration: float = 10.0
    ddp_steps: int | None = None  # test-only: a long DDP job
    why_not_selected: str = "not selected"


Progress = Callable[[str, str], None]


def skipped(stage: str, why: str) -> list[CheckResult]:
    return [CheckResult(name, Status.SKIP, f"{name} skipped: {why}") for name in NAMES[stage]]


def member(node: Node, transport: Transport, facts: NodeFacts, interface: str | None, one_node: bool) -> Member:
    """What a stage needs about a node: its cluster address and interface (loopback when it is alone)."""
    torch = facts.torch
    gpus = (torch.get("device_count") or 0) if torch.get("cuda_available") else 0
    hostname = (facts.raw.get("hostname") or {}).get("hostname") if isinstance(facts.raw, dict) else None
    if one_node:
        return Member(node, transport, facts, "127.0.0.1", "lo", None, gpus)
    return Member(node, transport, facts, cluster_address(facts, interface), interface, hostname, gpus)


def cluster_address(facts: NodeFacts, interface: str | None) -> str:
    """The node's IPv4 address on the cluster interface: the inventory address when it is one of them."""
    from clustercheck import facts as parse

    addr = facts.command("ip_addr")
    entries = parse.parse_ip_addr(addr.get("out", "")) if addr.get("rc") == 0 else []
    mine = [str(e["address"].ip) for e in entries if e["iface"] == interface and e["address"].version == 4]
    if facts.node.address in mine:
        return facts.node.address
    if mine:
        return mine[0]
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(facts.node.address))
    return facts.node.address


def run_stages(
    members: list[Member], missing: dict[str, str], options: StageOptions, progress: Progress
) -> list[CheckResult]:
    """Every selected stage in order; MISSING names nodes that did not get through the per-node phase."""
    results: list[CheckResult] = []
    blocked = (
        "; ".join(f"{name}: {why}" for name, why in sorted(missing.items())) + " (a multi-node job needs every node)"
        if missing
        else None
    )
    no_torch = [m.name for m in members if "error" in m.facts.torch or m.facts.python_missing]
    for stage in DISTRIBUTED:
        if stage not in options.stages:
            results += skipped(stage, options.why_not_selected)
            continue
        if blocked:
            results += skipped(stage, blocked)
            continue
        if stage != "network" and no_torch:
            results += skipped(stage, f"torch does not import on {', '.join(no_torch)}")
            continue
        for m in members:
            progress(m.name, stage)
        if stage == "network":
            stage_results = network_stage(members, options)
        elif stage == "collectives":
            stage_results = collectives_stage(members, options)
        else:
            stage_results = ddp_stage(members, options)
        results += stage_results
        problems = [r for r in stage_results if r.status.is_problem]
        if problems:
            blocked = f"the {stage} stage failed ({problems[0].message})"
            if stage == "network":
                blocked = f"the network stage failed, so no torch job was started ({problems[0].message})"
    return results


# ---------------------------------------------------------------------------------------------- helpers


def _parallel(function: Callable[[Member], None], members: list[Member]) -> None:
    threads = [threading.Thread(target=function, args=(m,), daemon=True, name=m.name) for m in members]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _upload(transport: Transport, worker: str, remote: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / f"{worker}.py"
        local.write_text(resources.files("clustercheck.worker").joinpath(f"{worker}.py").read_text())
        transport.put(str(local), remote)


def _host_dir(options: StageOptions, name: str) -> Path:
    path = options.local_dir / "hosts" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _tail(result: CommandResult, lines: int = ERROR_LINES) -> list[str]:
    text = (result.stdout + "\n" + result.stderr).splitlines()
    return [line.rstrip() for line in text if line.strip(" =-")][-lines:]


# ---------------------------------------------------------------------------------------------- network


def network_stage(members: list[Member], options: StageOptions) -> list[CheckResult]:
    port = network.pick_ephemeral_port()
    peers = [network.Peer(m.name, m.address, m.hostname) for m in members]
    records: dict[str, dict] = {}
    errors: dict[str, str] = {}

    def probe(m: Member) -> None:
        try:
            _probe(m)
        except Exception as exc:  # one node's trouble is that node's network.probe ERROR, not a crash
            errors[m.name] = f"{type(exc).__name__}: {exc}"

    def _probe(m: Member) -> None:
        path = launch.worker_path(m.transport.workdir, "netprobe")
        _upload(m.transport, "netprobe", path)
        command = network.mesh_command(
            m.facts.python, path, m.name, peers, [options.master_port, port], options.network_duration
        )
        answer = m.transport.run(command, timeout=options.network_duration + 30)
        (_host_dir(options, m.name) / "network.json").write_text(answer.stdout)
        (_host_dir(options, m.name) / "network.stderr").write_text(answer.stderr)
        try:
            records[m.name] = json.loads(answer.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            errors[m.name] = answer.cause()

    _parallel(probe, members)
    results = network.evaluate(
        records, peers, master=members[0].name, master_port=options.master_port, errors=errors, cidr=None
    )
    if len(members) == 1:  # one node: the ranks meet on 127.0.0.1 whatever the hostname resolves to
        name = members[0].name
        results = [r for r in results if r.name != "network.resolve"]
        results.append(
            CheckResult(
                "network.resolve",
                Status.SKIP,
                f"{name}: one node: its ranks meet on 127.0.0.1 (hostname.resolve covers its own name)",
                host=name,
            )
        )
    return results


# ---------------------------------------------------------------------------------------------- torch jobs


@dataclass
class JobOutcome:
    records: list[dict]
    world_size: int
    backend: str
    failure: str | None = None  # why the job did not complete, naming the first node that failed
    data: dict = field(default_factory=dict)


def _signal_death(result: CommandResult) -> bool:
    """torchrun's summary of a rank killed by a signal (the root cause, rather than its peers' errors)."""
    return bool(re.search(r"Signal \d+ \(SIG[A-Z]+\)|exitcode\s*:\s*-\d+", result.stdout + result.stderr))


def torch_job(
    members: list[Member], worker: str, options: StageOptions, worker_args: list[str] | None = None
) -> JobOutcome:
    """Run WORKER under torchrun on every node at once; every node stops when one fails or at the deadline."""
    specs = [
        launch.NodeSpec(m.name, m.address, m.gpus, m.facts.python, m.transport.workdir.rstrip("/")) for m in members
    ]
    backend = launch.choose_backend([m.gpus for m in members])
    per_node_env = {
        m.name: {"NCCL_SOCKET_IFNAME": m.interface, "GLOO_SOCKET_IFNAME": m.interface} for m in members if m.interface
    }
    plans = launch.plan(
        specs,
        worker=worker,
        stage=worker,
        master_port=options.master_port,
        interface=members[0].interface,
        worker_args=worker_args,
        nproc_override=options.nproc_per_node,
        backend=backend,
        extra_env=per_node_env,
    )
    by_name = {m.name: m for m in members}
    world = launch.world_size(plans)
    for plan in plans:
        _upload(by_name[plan.node.name].transport, worker, launch.worker_path(plan.node.run_dir, worker))
        (_host_dir(options, plan.node.name) / f"{worker}.command").write_text(plan.shell() + "\n")

    lock = threading.Lock()
    failed = threading.Event()
    stopping = threading.Event()
    ends: dict[str, tuple[float, CommandResult, bool]] = {}  # name -> (when, result, ended before the stop)
    deadline = time.monotonic() + options.timeout

    def start(plan: launch.NodeLaunch) -> None:
        m = by_name[plan.node.name]
        try:
            result = m.transport.run(plan.command, timeout=max(1.0, deadline - time.monotonic()), env=plan.env)
        except Exception as exc:  # the connection broke: that node failed
            result = CommandResult(None, "", f"{type(exc).__name__}: {exc}")
        with lock:
            ends[m.name] = (time.monotonic(), result, not stopping.is_set())
        if not result.ok:
            failed.set()

    threads = [threading.Thread(target=start, args=(p,), daemon=True, name=p.node.name) for p in plans]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads) and not failed.is_set():
        time.sleep(0.1)
    if failed.is_set():
        # Give the other nodes a moment to report their own view (a killed rank's node says "Signal 9"),
        # then stop every torchrun still running, on every node.
        grace = time.monotonic() + FAILURE_GRACE
        while any(t.is_alive() for t in threads) and time.monotonic() < grace:
            time.sleep(0.1)
        stopping.set()
        _parallel(lambda m: m.transport.stop(), [m for m in members if m.name not in ends])
        for thread in threads:
            thread.join(30)

    outcome = JobOutcome([], world, backend, data={"world_size": world, "backend": backend})
    for m in members:
        result = ends[m.name][1] if m.name in ends else CommandResult(None, "", "no result")
        (_host_dir(options, m.name) / f"{worker}.torchrun.log").write_text(result.stdout + result.stderr)
        _fetch_logs(m, worker, options)
        with contextlib.suppress(TransportError, OSError):
            got = m.transport.run(launch.collect_command(m.facts.python, m.transport.workdir, worker), timeout=60)
            outcome.records += launch.parse_records(got.stdout)

    first = first_failure(ends)
    timed_out = [name for name, (_, result, _) in ends.items() if result.timed_out]
    if first is not None:
        name, result = first
        lines = _tail(result)
        outcome.failure = (
            f"torchrun failed on {name} first ({_exit(result)}); every node's job was stopped. "
            f"Last lines from {name}: " + " | ".join(lines)
        )
        outcome.data.update({"first_failed_node": name, "error_lines": lines})
    elif timed_out or any(not r.ok for _, r, _ in ends.values()):
        outcome.failure = (
            f"the {worker} job did not finish within {options.timeout:.0f} s (--timeout); every node's job was "
            f"stopped (waiting: {', '.join(sorted(timed_out)) or 'all nodes'})"
        )
        outcome.data.update({"timed_out": True, "first_failed_node": None})
    return outcome


def first_failure(ends: dict[str, tuple[float, CommandResult, bool]]) -> tuple[str, CommandResult] | None:
    """The node whose torchrun failed first, of those that ended on their own (not stopped by us, not at the
    deadline): a node reporting a rank killed by a signal is the root cause its peers' errors follow from;
    otherwise the earliest. ENDS: node -> (when it ended, its result, whether it ended before the stop)."""
    own = [(when, name, result) for name, (when, result, before_stop) in ends.items() if before_stop]
    failed = [f for f in own if not f[2].ok and not f[2].timed_out]
    if not failed:
        return None
    _, name, result = min(failed, key=lambda f: (not _signal_death(f[2]), f[0]))
    return name, result


def _exit(result: CommandResult) -> str:
    return "no exit status: killed or disconnected" if result.exit_status is None else f"exit {result.exit_status}"


def _fetch_logs(m: Member, worker: str, options: StageOptions) -> None:
    """The rank logs torchrun kept (and NCCL's INFO logs) into the local run directory, best effort."""
    workdir = m.transport.workdir.rstrip("/")
    archive = f"{workdir}/{worker}-logs.tgz"
    script = f"cd {workdir} && tar czf {archive} {worker} $(ls nccl-*.log 2>/dev/null)"
    target = _host_dir(options, m.name)
    local = target / f"{worker}-logs.tgz"
    with contextlib.suppress(TransportError, OSError, tarfile.TarError):
        if not m.transport.run(["sh", "-c", script], timeout=60).ok:
            return
        m.transport.get(archive, str(local))
        with tarfile.open(local) as tar:
            tar.extractall(target, filter="data")
        local.unlink()


def _with_failure(results: list[CheckResult], outcome: JobOutcome) -> list[CheckResult]:
    for r in results:
        if outcome.failure and r.status in (Status.FAIL, Status.ERROR, Status.SKIP):
            r.status = Status.FAIL
            r.message = f"{r.name} did not complete: {outcome.failure}"
            r.remediation = (
                "Look at the node's rank logs in the run directory (hosts/<node>/<stage>/); a killed rank or a node "
                "that cannot reach the master are the usual causes."
            )
            r.data.update(outcome.data)
    return results


def collectives_stage(members: list[Member], options: StageOptions) -> list[CheckResult]:
    try:
        thresholds = bandwidth.parse_min_busbw(options.min_busbw)
        outcome = torch_job(members, "collectives", options)
    except (launch.LaunchError, bandwidth.ThresholdError, TransportError, OSError) as exc:
        return [CheckResult(name, Status.ERROR, f"{name}: {exc}") for name in NAMES["collectives"]]
    results = collectives.evaluate(outcome.records, outcome.world_size)
    results += bandwidth.evaluate(outcome.records, outcome.world_size, thresholds)
    return _with_failure(results, outcome)


def ddp_stage(members: list[Member], options: StageOptions) -> list[CheckResult]:
    args = ["--steps", str(options.ddp_steps)] if options.ddp_steps else None
    try:
        outcome = torch_job(members, "ddp", options, args)
    except (launch.LaunchError, TransportError, OSError) as exc:
        return [CheckResult(ddp.NAME, Status.ERROR, f"{ddp.NAME}: {exc}")]
    result = ddp.evaluate(outcome.records, outcome.world_size)
    return _with_failure([result], outcome)
