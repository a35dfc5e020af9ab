"""The core stage, per node: one first command (the node's identity, clock and python, and what earlier runs left),
the facts (the node-side bundle uploaded with the collector's run), the per-node checks, and collectives across the
node's own ranks. Then, over the nodes that answered, the cross-node consistency checks."""

from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, field, replace

from clustercheck.checks import connection, gpuburn, gpuperf, registry
from clustercheck.facts import collect, filesystems, firstcommand
from clustercheck.facts.model import NodeFacts
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.stages import (
    Context,
    Member,
    bundle,
    evidence,
    gpuwork,
    image,
    localjob,
    nodeprogram,
    packagelist,
    shared,
)

# What run/pipeline.py, launcher/connect.py and stages/shared.py reach through this module, moved to the modules
# named for what they do.
from clustercheck.transport import (
    UPLOAD_FAILED,
    WORKDIR_PREFIX,
    CommandResult,
    Transport,
    parse_stale,
    stale_sweep_script,
)

NAME = "core"
RECORDED_PYTHON = "/etc/clustercheck/python"


class Aborted(Exception):
    """The run is being stopped (Ctrl-C, or another part of it failed): leave this node alone."""


@dataclass
class HostOutcome:
    results: list[CheckResult] = field(default_factory=list)
    facts: NodeFacts | None = None


SWEEP_TIME = 30.0  # seconds the startup sweep may add to the first command (a GPU node runs hundreds of processes)

# The facts collector after the first command's steps, in the same command (firstcommand.first_script's THEN; arguments:
# the work directory, the bundle's SHA-256 when it goes on standard input (else empty), the collector's own): with
# the python found, else python3 without torch; the bundle installed first when it comes along (bundle.INSTALL).
COLLECT = (
    'd=$4; sum=$5; shift 5; [ "$runs" = yes ] || { py=python3; set -- "$@" --no-torch; }; '
    f'[ -z "$sum" ] || exec sh -c {shlex.quote(bundle.INSTALL)} sh "$d" "$sum" "$py" "$d/{bundle.FILE}" facts "$@"; '
    f'exec "$py" "$d/{bundle.FILE}" facts "$@"'
)


@dataclass
class Collected:
    """The facts collector's run: its JSON object (None when it printed none), its output and exit, its seconds."""

    raw: dict | None
    answer: CommandResult
    seconds: float


@dataclass
class NodeStart:
    """What the first command on a node found (`start`)."""

    identity: firstcommand.Identity | None
    python: str  # the python to run the node-side programs with
    source: str  # where it came from
    missing: str | None  # the python asked for, when it does not start (python3 is used then)
    shell: str | None  # the login shell ($SHELL)
    home: str | None
    clock_offset: float | None  # node clock minus control clock
    clock_uncertainty: float | None  # half the round trip the offset was measured over
    leftovers: tuple[list[dict], list[dict]] | None  # what the startup sweep stopped (parse_stale); None: not swept
    error: str | None = None  # why the command failed before the collector, when it did
    collected: Collected | None = None  # the facts, when they were asked for
    filesystems: filesystems.Filesystems | None = None  # what the first command read of them (remote/filesystems.sh)

    def facts_problem(self, deadline: float) -> str | None:
        """Why the collector gave no facts (None when it did), DEADLINE its time: said alike by the core stage,
        node-health and the launcher. A file system that kept it from being written or run is named first."""
        collected = self.collected
        if collected is None:
            why = f"the command ended before the collector started: {self.error or 'no output'}"
        elif collected.raw is not None:
            return None
        else:
            failure = nodeprogram.judge("", "facts", collected.answer, deadline).failure
            why = failure.cause if failure is not None else "no answer"
        cause = self.stopped_by()
        if cause is None:
            return why
        uploaded = collected is not None and collected.answer.exit_status == UPLOAD_FAILED
        effect = "clustercheck's programs could not be written there" if uploaded else "the collector failed"
        return f"{cause.text}: {effect} ({why})"

    def stopped_by(self) -> filesystems.Cause | None:
        """The file system that kept the collector from being written or run (full, read-only, noexec), when the
        first command's reading of them and the collector's exit and words say one did (filesystems.diagnose)."""
        if self.collected is not None and self.collected.raw is not None:
            return None
        answer = self.collected.answer if self.collected is not None else None
        said = f"{answer.stderr}\n{answer.stdout}" if answer is not None else self.error or ""
        status = answer.exit_status if answer is not None else None
        return filesystems.diagnose(self.filesystems, said, status, WORKDIR_PREFIX, wrote=status == UPLOAD_FAILED)

    def facts_fix(self) -> str | None:
        """The fix for what facts_problem names, when a file system is why."""
        cause = self.stopped_by()
        return cause.fix if cause is not None else None


@dataclass(frozen=True)
class Pythons:
    """The python the first command tries on a node, and the one it falls back to."""

    asked: str  # --python or the inventory's clustercheck_python ("": none, the recorded one is tried)
    source: str  # where ASKED came from ("" with none)
    fallback: str
    fallback_source: str

    @classmethod
    def of(cls, node: Node, configured: str | None) -> Pythons:
        if configured:
            asked, source = configured, "--python"
        elif node.python:
            asked, source = node.python, "clustercheck_python in the inventory"
        else:
            asked, source = "", ""
        if node.is_local:
            return cls(asked, source, sys.executable, "the python running clustercheck")
        return cls(asked, source, "python3", "default")


class Arrivals:
    """The first command's output as it streams in, and when its parts came: the clock line first (the clock
    offset is taken then), then, WITH_COLLECTOR, the collector's output after firstcommand.FACTS_LINE."""

    MARKER = firstcommand.FACTS_LINE + "\n"

    def __init__(self, with_collector: bool) -> None:
        self.with_collector = with_collector
        self.parts: list[str] = []
        self.errors: list[str] = []  # its standard error (a failed write says why there)
        self.clock_at: float | None = None
        self.collector_at: float | None = None
        self._seen = ""

    def take(self, stream: str, text: str) -> None:
        if stream != "stdout":
            self.errors.append(text)
            return
        now = time.time()
        if self.clock_at is None:
            self.clock_at = now
        self.parts.append(text)
        if self.with_collector and self.collector_at is None:
            self._seen = (self._seen + text)[-2 * len(self.MARKER) :]
            if self.MARKER in self._seen:
                self.collector_at = now

    @property
    def text(self) -> str:
        return "".join(self.parts)


def start(
    node: Node,
    transport: Transport,
    configured: str | None = None,
    *,
    sweep: bool = False,
    timeout: float = 30,
    collect: list[str] | None = None,
    collect_timeout: float = 0,
    paths: tuple[str, ...] = (),
) -> NodeStart:
    """The first command on a node, one round trip for what took nine commands before: its identity (so that
    two inventory names of one machine are told apart), clock, login shell and home, and which python to run the
    node-side programs with (CONFIGURED (--python), the inventory's clustercheck_python, the one recorded on the
    node, else python3) and whether it starts within TIMEOUT seconds; with SWEEP, what earlier runs left is stopped
    (stale_sweep_script); with COLLECT (the collector's arguments), the facts collector then runs, the whole
    command within COLLECT_TIMEOUT seconds (the deadline a later run's sweep reads, were the node to freeze), the
    bundle uploaded on its standard input when it is not on the node yet. On a large cluster every command costs
    the controller CPU. PATHS: CLASS=PATH pairs of the file systems a job needs besides /tmp, /dev/shm and the home
    (remote/filesystems.sh), read before anything is written."""
    pythons = Pythons.of(node, configured)
    argv, stdin = first_command(transport, pythons, timeout, sweep, collect, paths)
    arrivals = Arrivals(collect is not None)
    took = timeout + (SWEEP_TIME if sweep else 0) + 2  # the steps before the collector: moments, unless one hangs
    if collect is not None:
        took = max(took, collect_timeout)  # the collector's deadline is the command's: a hung step eats into it
    before = time.time()
    answer = nodeprogram.run(transport, argv, timeout=took, stdin=stdin, on_output=arrivals.take)
    ended = time.time()
    if not answer.stderr and arrivals.errors:
        answer = replace(answer, stderr="".join(arrivals.errors))
    if collect is not None:
        bundle.carried(transport, stdin, answer)
    found = firstcommand.parse_first(arrivals.text)
    collected = collected_facts(transport.host, found, answer, arrivals, ended, took)
    return node_start(found, answer, pythons, clock(found, arrivals, before), sweep, collect is not None, collected)


def job_paths(data_paths: tuple[str, ...], shared_dir: str | None) -> tuple[str, ...]:
    """The user's paths a job needs, as remote/filesystems.sh takes them (CLASS=PATH): the data paths and the
    shared directory (the checkpoint)."""
    return tuple(f"data={p}" for p in data_paths) + ((f"shared={shared_dir}",) if shared_dir else ())


def first_command(
    transport: Transport,
    pythons: Pythons,
    timeout: float,
    sweep: bool,
    collect: list[str] | None,
    paths: tuple[str, ...] = (),
) -> tuple[list[str], str | None]:
    """The first command's argv and standard input (the bundle, when the collector runs and it is not on the
    node yet)."""
    sweeping = stale_sweep_script(transport.run_id) if sweep else None
    script = firstcommand.first_script(RECORDED_PYTHON, sweeping, COLLECT if collect is not None else None, paths)
    argv = ["sh", "-c", script, "sh", pythons.asked, pythons.fallback, str(int(max(1.0, timeout)))]
    if collect is None:
        return argv, None
    stdin = bundle.to_send(transport)
    return [*argv, transport.workdir, bundle.digest() if stdin is not None else "", *collect], stdin


def collected_facts(
    host: str, found: firstcommand.FirstAnswer, answer: CommandResult, arrivals: Arrivals, ended: float, took: float
) -> Collected | None:
    """The collector's part of the first command (None when it did not start), judged as the `facts` program's
    answer, and its own seconds."""
    if found.then is None:
        return None
    output = CommandResult(answer.exit_status, found.then, answer.stderr, answer.timed_out)
    raw = nodeprogram.judge(host, "facts", output, took).value
    return Collected(raw, output, ended - (arrivals.collector_at or ended))


def clock(found: firstcommand.FirstAnswer, arrivals: Arrivals, before: float) -> tuple[float | None, float | None]:
    """(node clock minus control clock, its uncertainty): the node's clock line against the moment it arrived,
    less half the round trip since the command was sent at BEFORE."""
    if found.clock is None or arrivals.clock_at is None:
        return None, None
    uncertainty = (arrivals.clock_at - before) / 2
    return found.clock - (before + uncertainty), uncertainty


def node_start(
    found: firstcommand.FirstAnswer,
    answer: CommandResult,
    pythons: Pythons,
    offset: tuple[float | None, float | None],
    sweep: bool,
    collecting: bool,
    collected: Collected | None,
) -> NodeStart:
    """What the first command's output FOUND says, with ANSWER's end: the python to use and where it came from,
    and what was swept (when the sweep's lines are all there)."""
    cause = answer.cause() if not answer.ok else "its output was cut short"
    if found.python_runs is None:  # cut short before the python was tried
        python = pythons.asked or pythons.fallback
        source = pythons.source or pythons.fallback_source
        return NodeStart(
            found.identity, python, source, None, None, None, None, None, None, cause, filesystems=found.filesystems
        )
    source = pythons.source or (RECORDED_PYTHON if found.recorded else pythons.fallback_source)
    python = found.python or pythons.asked or pythons.fallback
    complete = found.then is not None or (not collecting and answer.ok)  # the sweep's lines are all there
    stale = parse_stale(found.leftovers) if complete and found.leftovers is not None else None
    return NodeStart(
        identity=found.identity,
        python=python if found.python_runs else "python3",
        source=source,
        missing=None if found.python_runs else python,
        shell=found.shell,
        home=found.home,
        clock_offset=offset[0],
        clock_uncertainty=offset[1],
        leftovers=stale,
        error=cause if sweep and stale is None else None,
        collected=collected,
        filesystems=found.filesystems,
    )


def leftovers(node: Node, begun: NodeStart) -> CheckResult:
    """leftovers: what the startup sweep stopped of earlier runs on the node (a node that froze or was cut off
    while they ran), past their deadline."""
    check = registry.get("leftovers")
    if begun.leftovers is None:
        return check.result(node.name, registry.Finding(Status.WARN, f"could not look for them: {begun.error}"))
    processes, directories = begun.leftovers
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


def session(node: Node, transport: Transport, shell: str | None) -> CheckResult:
    """ssh.session: what the node's sshd did that the transport worked around in the run (the login shell's
    startup output, a limit on sessions per connection); SHELL: the login shell, as the first command read it."""
    check = registry.get("ssh.session")
    if node.is_local:
        return check.result(node.name, registry.skip("a local node: no SSH"))
    return check.result(node.name, connection.session_finding(transport.quirks, shell))


def run_host(node: Node, transport: Transport, ctx: Context, step, begun: NodeStart) -> HostOutcome:
    """Everything the core stage does on one node that answered, after its first command (BEGUN, which collected the
    facts: `collector_args`). STEP(stage) reports progress and raises Aborted when the run is being stopped."""
    config = ctx.config
    selection = config.selection
    host_dir = config.host_dir(node.name)
    outcome = HostOutcome([leftovers(node, begun)])
    python, source, missing = begun.python, begun.source, begun.missing
    collected = begun.collected
    output = collected.answer if collected else CommandResult(None, "", begun.error or "")
    nodeprogram.keep(output, host_dir / "facts.json")
    if collected is None or collected.raw is None:
        problem = begun.facts_problem(config.command_timeout)
        message = f"{node.name}: could not collect facts with {python}: {problem}"
        outcome.results.append(_facts_error(node, message, begun.facts_fix()))
        return outcome
    seconds = collected.seconds  # the collector's own time (baseline.collector compares it)
    facts = collect.build(
        node,
        collected.raw,
        python=python,
        python_source=source,
        python_missing=missing,
        cluster_size=len(ctx.hosts),
        clock_offset=begun.clock_offset,
        clock_uncertainty=begun.clock_uncertainty,
        filesystems=begun.filesystems,
    )
    if config.container is not None:
        step(f"the environment in image {config.container.image}")
        facts = image.in_image(
            node, transport, config.container, facts, image.collector_args(node, config), config.command_timeout
        )
        environment = {key: facts.raw.get(key) for key in image.ENVIRONMENT}
        (host_dir / "image.json").write_text(json.dumps(environment, indent=1) + "\n")
    facts = replace(facts, models=config.models)
    packagelist.write_packages(facts, host_dir)
    if config.dcgm_level and facts.dcgmi and facts.smi is not None:
        step(f"DCGM diagnostic level {config.dcgm_level}")
        facts = replace(facts, dcgm=gpuwork.dcgm_diag(facts.dcgmi, config.dcgm_level, transport, host_dir))
    if facts.smi is not None and gpuperf.wanted(selection):
        step("the GPUs measured")
        facts = replace(facts, gpu_bench=gpuwork.measure_gpus(facts, transport, ctx, host_dir))
    if config.burn_seconds and facts.smi is not None and gpuburn.wanted(selection):
        step(f"the GPUs under load for {config.burn_seconds:g} s")
        facts = replace(facts, gpu_burn=gpuwork.burn_gpus(facts, transport, ctx, host_dir))
    outcome.facts = facts
    outcome.results.append(
        registry.get("facts").result(
            node.name,
            registry.passed(f"facts collected with {python} in {seconds:.1f} s", seconds=round(seconds, 3)),
        )
    )
    outcome.results += registry.run_node_checks(facts, selection)
    if evidence.failing(outcome.results):
        step("the GPU's evidence kept (nvidia-bug-report.sh)")
        outcome.results = evidence.noted(outcome.results, evidence.keep(facts, transport, host_dir))
    if not shared.defers_local(ctx.hosts, selection):  # else the run's torch job runs them (stages/shared.py)
        step("collectives on the node")
        outcome.results += localjob.local_collectives(facts, transport, ctx)
    outcome.facts = settled(facts)
    return outcome


def settled(facts: NodeFacts) -> NodeFacts:
    """FACTS as the rest of the run keeps them, once the node's own checks and evidence are done: without what
    nothing after them reads, which the run directory's facts.json keeps. That is the collector's raw command
    outputs, which the facts were parsed from, and the whole kernel log (kernel_log; dmesg alone is often hundreds
    of KB), whose lines a cluster check needs are facts of their own (neighbour_overflows). Kept, they were most
    of the controller's memory at 4,000 nodes (docs/benchmarks.md, "The whole run's controller side at 4,000
    nodes")."""
    raw = {key: value for key, value in facts.raw.items() if key != "commands"}
    return replace(facts, raw=raw, kernel_log=None)


def _facts_error(node: Node, message: str, fix: str | None = None) -> CheckResult:
    return registry.get("facts").result(
        node.name,
        registry.Finding(
            Status.ERROR,
            message.removeprefix(f"{node.name}: "),
            fix or "Look at facts.stderr in the run directory; check that python3 runs on the node.",
        ),
    )


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
