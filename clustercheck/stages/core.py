"""The core stage, per node: the clock, the environment's python, the facts (one upload of the node-side bundle,
one collector run), the per-node checks, and collectives across the node's own ranks. Then, over the nodes that
answered, the cross-node consistency checks."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from clustercheck.checks import connection, registry
from clustercheck.checks.collectives import COLLECTIVES, LOCAL_PREFIX
from clustercheck.checks.gpu import DCGM_DEADLINES
from clustercheck.facts import collect, parse
from clustercheck.facts.model import DcgmDiag, NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.stages import Context, Member, bundle, collectives, network
from clustercheck.transport import CommandResult, Transport, TransportError, parse_stale, stale_sweep_script

NAME = "core"
RECORDED_PYTHON = "/etc/clustercheck/python"
LOCAL_NAMES = tuple(LOCAL_PREFIX + n for n in COLLECTIVES)


class Aborted(Exception):
    """The run is being stopped (Ctrl-C, or another part of it failed): leave this node alone."""


@dataclass
class HostOutcome:
    results: list[CheckResult] = field(default_factory=list)
    facts: NodeFacts | None = None


def measure_clock_offset(transport: Transport, samples: int = 3) -> tuple[float | None, float | None]:
    """Node clock minus control clock, from the sample with the shortest round trip; (offset, half round trip)."""
    best: tuple[float, float] | None = None
    for _ in range(samples):
        before = time.time()
        answer = transport.run(["date", "+%s.%N"], timeout=15)
        after = time.time()
        if not answer.ok:
            continue
        try:
            remote_time = float(answer.stdout.strip())
        except ValueError:
            continue
        half_rtt = (after - before) / 2
        if best is None or half_rtt < best[1]:
            best = (remote_time - (before + half_rtt), half_rtt)
    return best if best else (None, None)


def stop_leftovers(node: Node, transport: Transport) -> CheckResult:
    """Stop what earlier runs left on the node past their deadline (a node that froze or was cut off while they
    ran), and say what it was."""
    check = registry.get("leftovers")
    answer = transport.run(["sh", "-c", stale_sweep_script(transport.run_id)], timeout=30)
    if not answer.ok:
        return check.result(node.name, registry.Finding(Status.WARN, f"could not look for them: {answer.cause()}"))
    processes, directories = parse_stale(answer.stdout)
    if not processes and not directories:
        return check.result(node.name, registry.passed("nothing of an earlier run was left"))
    runs = sorted({f["run"] for f in processes + directories})
    parts = []
    if processes:
        listing = "; ".join(f"pid {f['pid']} ({f['command'][:80]})" for f in processes[:5])
        more = f" and {len(processes) - 5} more" if len(processes) > 5 else ""
        parts.append(f"stopped {len(processes)} process(es) left past their deadline: {listing}{more}")
    if directories:
        parts.append(f"removed {len(directories)} work directory(ies): {', '.join(d['path'] for d in directories)}")
    return check.result(
        node.name,
        registry.Finding(
            Status.WARN,
            f"earlier run(s) {', '.join(runs)} left: {'; '.join(parts)}",
            data={"stopped": processes, "removed": directories},
        ),
    )


def identify(transport: Transport) -> parse.Identity | None:
    """The node's machine ID, boot ID and hostname (one command), read before anything else runs there: two
    inventory names of one machine share this run's work directory and processes there."""
    answer = transport.run(["sh", "-c", parse.IDENTITY_SCRIPT], timeout=30)
    return parse.parse_identity(answer.stdout) if answer.ok else None


def session(node: Node, transport: Transport) -> CheckResult:
    """ssh.session: what the node's sshd did that the transport worked around in the steps so far (the login
    shell's startup output, a limit on sessions per connection)."""
    check = registry.get("ssh.session")
    if node.is_local:
        return check.result(node.name, registry.skip("a local node: no SSH"))
    shell = None
    if transport.quirks.startup_output:
        answer = transport.run(["sh", "-c", 'echo "$SHELL"'], timeout=30)
        shell = answer.stdout.strip() or None if answer.ok else None
    return check.result(node.name, connection.session_finding(transport.quirks, shell))


def find_python(
    node: Node, transport: Transport, configured: str | None, timeout: float = 30
) -> tuple[str, str, str | None]:
    """(python to run the collector with, where it came from, the configured python when it is missing); each of
    its two commands within TIMEOUT seconds."""
    if configured:
        python, source = configured, "--python"
    elif node.python:
        python, source = node.python, "clustercheck_python in the inventory"
    else:
        recorded = transport.run(["cat", RECORDED_PYTHON], timeout=timeout)
        if recorded.ok and recorded.stdout.strip():
            python, source = recorded.stdout.strip(), RECORDED_PYTHON
        elif node.is_local:
            python, source = sys.executable, "the python running clustercheck"
        else:
            python, source = "python3", "default"
    probe = transport.run([python, "-c", "import sys; print(sys.executable)"], timeout=timeout)
    if probe.ok:
        return python, source, None
    return "python3", source, python


def run_host(node: Node, transport: Transport, ctx: Context, step) -> HostOutcome:
    """Everything the core stage does on one node that answered. STEP(stage) reports progress and raises Aborted
    when the run is being stopped."""
    config = ctx.config
    selection = config.selection
    host_dir = config.host_dir(node.name)
    outcome = HostOutcome()
    # The steps before the facts need nothing of each other, and each is a round trip or more: they run at once,
    # over the node's one connection.
    step("leftovers, clock, python, upload")
    with ThreadPoolExecutor(max_workers=3, thread_name_prefix=f"{node.name}-core") as pool:
        leftovers = pool.submit(stop_leftovers, node, transport)
        clock = pool.submit(measure_clock_offset, transport)
        upload = pool.submit(bundle.install, transport)
        python, source, missing = find_python(node, transport, config.python)
    outcome.results.append(leftovers.result())
    offset, uncertainty = clock.result()
    step("facts")
    try:
        upload.result()
    except (TransportError, OSError) as exc:
        outcome.results += [session(node, transport), _facts_error(node, f"{node.name}: {exc}")]
        return outcome
    outcome.results.append(session(node, transport))
    args = [str(max(10.0, config.command_timeout - 15))] + (["--no-torch"] if missing else [])
    for package in node.packages:
        args += ["--package", package]
    started = time.monotonic()
    raw, collected = collect_raw(transport, python, config.command_timeout, *args)
    seconds = time.monotonic() - started  # the collector's own time (baseline.collector compares it)
    (host_dir / "facts.json").write_text(collected.stdout)
    (host_dir / "facts.stderr").write_text(collected.stderr)
    if raw is None:
        cause = f"timed out after {config.command_timeout:.0f} s" if collected.timed_out else collected.cause()
        outcome.results.append(_facts_error(node, f"{node.name}: could not collect facts with {python}: {cause}"))
        return outcome
    facts = collect.build(
        node,
        raw,
        python=python,
        python_source=source,
        python_missing=missing,
        cluster_size=len(ctx.hosts),
        clock_offset=offset,
        clock_uncertainty=uncertainty,
    )
    facts.models = config.models
    outcome.facts = facts
    write_packages(facts, host_dir)
    if config.dcgm_level and facts.dcgmi and facts.smi is not None:
        step(f"DCGM diagnostic level {config.dcgm_level}")
        facts.dcgm = dcgm_diag(facts.dcgmi, config.dcgm_level, transport, host_dir)
    outcome.results.append(
        registry.get("facts").result(
            node.name,
            registry.passed(f"facts collected with {python} in {seconds:.1f} s", seconds=round(seconds, 3)),
        )
    )
    outcome.results += registry.run_node_checks(facts, selection.check_selected, _why_not(selection))
    step("collectives on the node")
    outcome.results += local_collectives(facts, transport, ctx)
    return outcome


def collect_raw(transport: Transport, python: str, timeout: float, *args: str) -> tuple[dict | None, CommandResult]:
    """The bundle's facts program run with PYTHON under TIMEOUT (the bundle uploaded first, once per node and run):
    the collector's JSON object (None when it printed none) and the command's result."""
    bundle.install(transport)
    answer = transport.run(bundle.command(python, transport.workdir, "facts", *args), timeout=timeout)
    raw = None
    if answer.ok:
        with contextlib.suppress(ValueError, IndexError):
            raw = json.loads(answer.stdout.strip().splitlines()[-1])
    return (raw if isinstance(raw, dict) else None), answer


def dcgm_diag(dcgmi: str, level: int, transport: Transport, host_dir) -> DcgmDiag:
    """`dcgmi diag -r LEVEL` with the level's deadline; its output kept as hosts/<node>/dcgm-diag.txt."""
    deadline = DCGM_DEADLINES[level]
    result = transport.run([dcgmi, "diag", "-r", str(level)], timeout=deadline)
    (host_dir / "dcgm-diag.txt").write_text(result.stdout + result.stderr)
    parsed = parse.parse_dcgmi_diag(result.stdout)
    error = None
    if result.timed_out:
        error = f"no verdict within {deadline:.0f} s (stopped)"
    elif not parsed["tests"]:
        error = "no test result in its output" if result.ok else result.cause()
    return DcgmDiag(level, parsed["tests"], parsed["metadata"], error)


def write_packages(facts: NodeFacts, host_dir) -> None:
    """The node's full package lists into the run directory (what consistency.packages compares), in
    `pip freeze` and `conda list --export` form."""
    if facts.packages is None:
        return
    lines = [f"# {facts.host}: {facts.python} ({facts.packages.prefix})", "# pip"]
    lines += [f"{name}=={version}" for name, version in sorted(facts.packages.pip.items())]
    if facts.packages.conda is not None:
        lines += ["# conda"] + [f"{name}={version}" for name, version in sorted(facts.packages.conda.items())]
    (host_dir / "packages.txt").write_text("\n".join(lines) + "\n")


def _why_not(selection) -> str:
    globs = selection.globs
    return f"not selected (--skip {' '.join(globs)})" if globs else "not selected"


def _facts_error(node: Node, message: str) -> CheckResult:
    return registry.get("facts").result(
        node.name,
        registry.Finding(
            Status.ERROR,
            message.removeprefix(f"{node.name}: "),
            "Look at facts.stderr in the run directory; check that python3 runs on the node.",
        ),
    )


def local_collectives(facts: NodeFacts, transport: Transport, ctx: Context) -> list[CheckResult]:
    """local.* on one node; not run when deselected, when torch does not import, or on a one-node run whose
    collectives stage is this very job."""
    name = facts.host
    selection = ctx.config.selection
    checks = [registry.get(n) for n in LOCAL_NAMES]
    if len(ctx.hosts) == 1 and selection.stage_selected("collectives"):
        why = "on one node the collectives stage runs this very job"
        return [c.result(name, registry.skip(f"{c.name} skipped: {why}")) for c in checks]
    if not any(selection.check_selected(n) for n in LOCAL_NAMES):
        return [c.result(name, registry.skip(f"{c.name} skipped: {selection.why_not_check(c.name)}")) for c in checks]
    problem = facts.torch_problem
    if problem:
        return [c.result(name, registry.skip(f"{c.name} skipped: torch does not import")) for c in checks]
    member = Member(facts.node, transport, facts, "127.0.0.1", "lo", None, facts.gpus_for_torch)
    results = collectives.run_local(member, ctx, local_port(transport, facts.python))
    return [
        r
        if selection.check_selected(r.name)
        else registry.get(r.name).result(name, registry.skip(f"{r.name} skipped: {selection.why_not_check(r.name)}"))
        for r in results
    ]


def local_port(transport: Transport, python: str) -> int:
    """A port free on the node's loopback for its node-local job, never the master port: a stale process there is
    the network stage's finding (network.master_port), not the node-local collectives'."""
    answer = transport.run(bundle.command(python, transport.workdir, "netprobe", "free-port"), timeout=30)
    with contextlib.suppress(ValueError):
        port = int(answer.stdout.strip())
        if answer.ok and 1024 <= port <= 65535:
            return port
    return network.pick_ephemeral_port()


def members(nodes: list[Node], transports: dict[str, Transport], facts: dict[str, NodeFacts]) -> list[Member]:
    """What the multi-node stages need about every node that got through the core stage: its cluster address
    and interface (loopback when it is alone)."""
    out = []
    for node in nodes:
        f = facts[node.name]
        hostname = f.hostname.name if f.hostname else None
        if len(nodes) == 1:
            out.append(Member(node, transports[node.name], f, "127.0.0.1", "lo", None, f.gpus_for_torch))
        else:
            out.append(
                Member(
                    node,
                    transports[node.name],
                    f,
                    collect.cluster_address(f),
                    f.interface,
                    hostname,
                    f.gpus_for_torch,
                )
            )
    return out
