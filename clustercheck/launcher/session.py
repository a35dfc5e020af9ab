"""The I/O of `clustercheck launch`, `jobs`, `logs` and `stop`: connecting through the transport factory, the
preflight (the pipeline with only the core and network stages), the same-code check or --sync, then torchrun on
every node, in the foreground (output streamed, every node stopped when one fails or on Ctrl-C) or under a
systemd unit per node (--detach).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clustercheck import report
from clustercheck.config import RunConfig
from clustercheck.facts import collect
from clustercheck.facts.model import NodeFacts
from clustercheck.fanout import fanout
from clustercheck.inventory import Node
from clustercheck.launcher import command as cmd
from clustercheck.launcher import detached, output, sameness
from clustercheck.model import CheckResult, Status
from clustercheck.run.pipeline import Pipeline
from clustercheck.selection import Selection
from clustercheck.stages import Member, bundle, core, rootcause
from clustercheck.stages.launch import LaunchError, NodeLaunch, NodeSpec
from clustercheck.transport import CommandResult, HostKeyError, Transport, TransportError, new_run_id
from clustercheck.transport.factory import Factory
from clustercheck.transport.params import SshSettings

FAILURE_GRACE = 5.0  # seconds the other nodes get to end on their own once one node's torchrun failed
FOREVER = 10 * 365 * 24 * 3600.0  # a training job has no deadline of ours
PREFLIGHT = Selection(only=("core", "network"), skip=("local.*",))  # quick: no torch job before the user's own

Echo = Callable[[str], None]


class NotStarted(Exception):
    """The job was not started (preflight, a node, the code); the message is one line."""


class HostKeysRefused(NotStarted):
    """A host key was unknown or changed: nothing was run there."""


@dataclass(frozen=True)
class LaunchOptions:
    command: cmd.UserCommand
    run_dir: Path
    ssh: SshSettings = field(default_factory=SshSettings)
    python: str | None = None
    nproc_per_node: int | None = None
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    sync: Path | None = None
    chdir: str | None = None
    preflight: bool = True
    detach: bool = False
    facts_timeout: float = 120.0


@dataclass
class Finished:
    """How a foreground job ended: the exit status clustercheck passes on, and what to say about it."""

    status: int
    message: str


def sync_script(sync: Path, script: str) -> str:
    """The script's path inside --sync DIR, relative to it (the job runs in the synced copy)."""
    base = sync.resolve()
    path = Path(script).expanduser()
    path = (path if path.is_absolute() else base / path).resolve()
    try:
        relative = path.relative_to(base)
    except ValueError:
        raise LaunchError(f"{script}: not inside --sync {sync}") from None
    if not path.is_file():
        raise LaunchError(f"{script}: no such file in --sync {sync}")
    return str(relative)


def archive(directory: Path, skip_paths: tuple[str, ...] = ()) -> bytes:
    """The code under DIRECTORY as a tar.gz: what the same-code check compares (sameness.code_files), so neither
    environments, caches, version control nor run directories are uploaded."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for relative, full in sameness.local_files(str(directory), skip_paths):
            tar.add(full, arcname=relative, recursive=False)
    return buffer.getvalue()


class Launch:
    """One launch across NODES, in inventory order."""

    def __init__(self, nodes: list[Node], options: LaunchOptions, factory: Factory, echo: Echo, say: Echo) -> None:
        self.nodes = nodes
        self.options = options
        self.factory = factory
        self.echo = echo  # the job's own output
        self.say = say  # clustercheck's progress and verdict
        self.job_id = new_run_id()
        self.transports: dict[str, Transport] = {}
        self.members: list[Member] = []
        self.plans: list[NodeLaunch] = []
        self.homes: dict[str, str] = {}
        self.preflight_facts: dict[str, NodeFacts] = {}  # what the preflight collected, not collected again
        self.cwd: str | None = None
        self.trees: dict[str, sameness.Tree] = {}  # the script's directory on each node, when it was compared
        self._recorded: list[Member] = []  # the nodes where this launch was recorded as running from that directory
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ before the job

    def preflight(self) -> None:
        """The core and network stages through the pipeline; any FAIL or ERROR refuses the launch."""
        o = self.options
        config = RunConfig(
            run_dir=o.run_dir / "preflight",
            selection=PREFLIGHT,
            python=o.python,
            master_port=o.master_port,
            ssh=o.ssh,
        )
        self.say(f"preflight: core and network checks on {len(self.nodes)} node(s)")
        started = time.time()
        pipeline = Pipeline(self.nodes, config, self.factory)
        outcome = pipeline.run()
        document = report.Report(
            outcome.results, [n.name for n in self.nodes], pipeline.run_id, started, time.time() - started
        )
        written = o.run_dir / "preflight" / "report.json"
        written.parent.mkdir(parents=True, exist_ok=True)  # no node may have answered, so nothing made it yet
        written.write_text(report.render(document, "json") + "\n")
        self.preflight_facts = outcome.facts
        if outcome.host_key_error:
            raise HostKeysRefused(_first_problem(outcome.results) or "host key verification failed")
        problems = [r for r in outcome.results if r.status.is_problem]
        if problems:
            # Each check's own fix: skipping the preflight would only start a job that fails the same way.
            for r in problems:
                fix = f"; fix: {r.remediation}" if r.remediation else ""
                self.say(f"  {r.status.value} {r.name}{' on ' + r.host if r.host else ''}: {r.message}{fix}")
            fix = f"; fix: {problems[0].remediation}" if problems[0].remediation else ""
            raise NotStarted(
                f"preflight failed ({len(problems)} check(s)), nothing was started: {_first_problem(problems)}{fix} "
                f"(report: {written})"
            )
        warned = sum(1 for r in outcome.results if r.status is Status.WARN)
        self.say(f"preflight passed ({len(outcome.results)} checks, {warned} warning(s))")

    def connect(self) -> None:
        """Connect to every node, find its environment python and its cluster address (the facts collector, unless
        the preflight collected them)."""
        answers = fanout(self._connect_one, self.nodes, name=lambda n: n.name)
        for i, node in enumerate(self.nodes):
            answer = answers.get(i, NotStarted(f"{node.name}: no answer"))
            if isinstance(answer, BaseException):
                if isinstance(answer, HostKeyError):
                    raise HostKeysRefused(str(answer))
                if isinstance(answer, NotStarted | TransportError):
                    raise NotStarted(str(answer) if str(answer).startswith(node.name) else f"{node.name}: {answer}")
                raise answer
        facts = {node.name: answers[i] for i, node in enumerate(self.nodes)}
        self.members = core.members(self.nodes, self.transports, facts)  # type: ignore[arg-type]

    def _connect_one(self, node: Node):
        def register(transport: Transport) -> None:
            with self._lock:
                self.transports[node.name] = transport

        transport = self.factory(node, self.job_id, register).transport
        home = transport.run(["sh", "-c", 'echo "$HOME"'], timeout=30).stdout.strip()
        with self._lock:
            self.homes[node.name] = home or "/tmp"
        if node.name in self.preflight_facts:
            return self.preflight_facts[node.name]
        python, source, missing = core.find_python(node, transport, self.options.python)
        if missing:
            raise NotStarted(f"{node.name}: the environment python {missing} ({source}) does not run")
        bundle.install(transport)
        timeout = self.options.facts_timeout
        got = transport.run(
            bundle.command(python, transport.workdir, "facts", str(max(10.0, timeout - 15))), timeout=timeout
        )
        try:
            raw = json.loads(got.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise NotStarted(f"{node.name}: could not collect facts with {python}: {got.cause()}") from None
        facts = collect.build(node, raw, python=python, python_source=source, cluster_size=len(self.nodes))
        if facts.torch_problem:
            raise NotStarted(f"{node.name}: {facts.torch_problem}")
        return facts

    def prepare(self) -> tuple[str, str | None, str | None]:
        """The script path and working directory on the nodes, and the code archive on the nodes (--sync), after
        checking that every node has the same code. Returns (script, cwd, archive path)."""
        o = self.options
        if o.sync is not None:
            script = sync_script(o.sync, o.command.script) if not o.command.is_module else o.command.script
            data = archive(o.sync, (str(o.run_dir.resolve()),))
            with tempfile.TemporaryDirectory() as tmp:
                local = Path(tmp) / "code.tgz"
                local.write_bytes(data)

                def upload(m: Member) -> None:
                    m.transport.put(str(local), f"{m.transport.workdir.rstrip('/')}/code.tgz")
                    if not o.detach:
                        target = f"{m.transport.workdir.rstrip('/')}/code"
                        got = m.transport.run(
                            ["sh", "-c", f"mkdir -p {target} && tar xzf {target}.tgz -C {target}"], timeout=300
                        )
                        if not got.ok:
                            raise NotStarted(f"{m.name}: could not unpack the synced code: {got.cause()}")

                self._each(upload, "copying --sync")
            self.say(f"synced {o.sync} ({len(data) >> 10} KiB) to {len(self.members)} node(s)")
            if o.detach:
                return script, "@code", "code.tgz"
            return script, f"{self.members[0].transport.workdir.rstrip('/')}/code", None
        if o.command.is_module:
            self.say("the script is a module (-m): its code is not compared between nodes")
            return o.command.script, o.chdir, None
        trees: dict[str, sameness.Tree] = {}
        skip = (str(o.run_dir.resolve()),)  # the launch's own run directory, where the control machine is a node

        def hash_one(m: Member) -> None:
            got = m.transport.run(sameness.command(m.facts.python, o.command.script, o.chdir, skip), timeout=300)
            trees[m.name] = (
                sameness.parse(got.stdout) if got.ok else sameness.Tree(error=f"hashing failed: {got.cause()}")
            )

        self._each(hash_one, "comparing the code")
        trees = {m.name: trees[m.name] for m in self.members}
        unusable = sameness.unusable(trees)
        if unusable:
            raise NotStarted("the script's directory could not be compared between the nodes: " + "; ".join(unusable))
        problems = sameness.problems(trees)
        if problems:
            raise NotStarted(
                "the script or its directory is not the same on every node: "
                + "; ".join(problems)
                + " (copy the same code to every node, or pass --sync DIR to upload it)"
            )
        self.trees = trees
        first = trees[self.members[0].name]
        self.say(f"{first.script}: the same {len(first.files)} file(s) on every node")
        for m in self.members:
            if trees[m.name].outputs:
                written = sameness.shown(sorted(trees[m.name].outputs))
                self.say(f"  not compared on {m.name}, written by earlier launches from there: {written}")
        return o.command.script, o.chdir, None

    def plan(self, script: str, cwd: str | None) -> list[NodeLaunch]:
        o = self.options
        specs = [
            NodeSpec(m.name, m.address, m.gpus, m.facts.python, m.transport.workdir.rstrip("/")) for m in self.members
        ]
        log_dirs = {
            m.name: f"{self.homes[m.name]}/.local/state/clustercheck/jobs/{self.job_id}/ranks"
            if o.detach
            else f"{m.transport.workdir.rstrip('/')}/ranks"
            for m in self.members
        }
        self.plans = cmd.plan(
            specs,
            o.command,
            job_id=self.job_id,
            master_port=o.master_port,
            interfaces={m.name: m.interface for m in self.members},
            log_dirs=log_dirs,
            nproc_override=o.nproc_per_node,
            env=o.env,
            script=script,
        )
        for p in self.plans:
            host_dir = o.run_dir / "hosts" / p.node.name
            host_dir.mkdir(parents=True, exist_ok=True)
            (host_dir / "launch.command").write_text(p.shell() + "\n")
        self.cwd = cwd
        return self.plans

    # ------------------------------------------------------------------ the job

    def run_foreground(self) -> Finished:
        """torchrun on every node, output streamed with node/rank prefixes and kept per node; when one node's
        torchrun fails, the others get FAILURE_GRACE seconds, then every node's processes are stopped."""
        o = self.options
        by_name = {m.name: m for m in self.members}
        firsts = cmd.first_ranks(self.plans, o.command.elastic)
        outputs = {p.node.name: output.NodeOutput(p.node.name, firsts[p.node.name]) for p in self.plans}
        logs = {name: (o.run_dir / "hosts" / name / "output.log").open("a") for name in outputs}
        ends: dict[str, tuple[float, CommandResult, bool]] = {}
        failed = threading.Event()
        stopping = threading.Event()
        started = time.monotonic()

        def emit(name: str, lines: list[str]) -> None:
            with self._lock:
                for line in lines:
                    self.echo(line)
                    logs[name].write(line + "\n")
                logs[name].flush()

        def start(p: NodeLaunch) -> None:
            name = p.node.name
            m = by_name[name]
            sink = outputs[name]
            try:
                result = m.transport.run(
                    _in_dir(p.command, _work_dir(m.node, self.cwd)),
                    timeout=FOREVER,
                    env=p.env,
                    on_output=lambda stream, text: emit(name, sink.feed(stream, text)),
                )
            except Exception as exc:  # the connection broke: that node failed
                result = CommandResult(None, "", f"{type(exc).__name__}: {exc}")
            emit(name, sink.flush())
            with self._lock:
                ends[name] = (time.monotonic(), result, not stopping.is_set())
            if not result.ok:
                failed.set()

        self._record_start(in_unit=False)
        threads = [threading.Thread(target=start, args=(p,), daemon=True, name=p.node.name) for p in self.plans]
        world = sum(p.nproc for p in self.plans)
        self.say(
            f"starting {o.command.script} on {len(self.plans)} node(s), "
            + (f"{world} rank(s)" if not o.command.elastic else "elastic")
            + f", master {self.plans[0].node.address}:{o.master_port}"
        )
        try:
            for thread in threads:
                thread.start()
            while any(t.is_alive() for t in threads) and not failed.is_set():
                time.sleep(0.1)
            if failed.is_set():
                grace = time.monotonic() + FAILURE_GRACE
                while any(t.is_alive() for t in threads) and time.monotonic() < grace:
                    time.sleep(0.1)
                stopping.set()
                self.stop_all(skip=set(ends))
                for thread in threads:
                    thread.join(30)
        finally:
            for fh in logs.values():
                with contextlib.suppress(OSError):
                    fh.close()
        elapsed = time.monotonic() - started
        own = [(when, name, r) for name, (when, r, before) in ends.items() if before and not r.ok]
        if not own:
            if len(ends) == len(self.plans) and all(r.ok for _, r, _ in ends.values()):
                return Finished(0, f"the job completed on every node in {elapsed:.0f} s (output: {o.run_dir})")
            return Finished(1, "the job ended without an exit status from every node; every node was stopped")
        _, name, result = min(own, key=lambda f: f[0])
        status = result.exit_status if result.exit_status is not None else 1
        why = "no exit status: killed or disconnected" if result.exit_status is None else f"exit {result.exit_status}"
        failure = rootcause.node_failure("\n".join(outputs[name].recent))
        if failure is not None:  # the failing rank's own error, not torchrun's report of it
            said = f"{name}'s {failure.text()}"
        else:
            said = f"Last lines from {name}: " + (
                " | ".join(outputs[name].tail) or (result.stderr.strip().splitlines() or [""])[-1]
            )
        return Finished(
            status,
            f"the job failed on {name} first ({why}) after {elapsed:.0f} s; every node's torchrun was stopped. {said}",
        )

    def start_detached(self, code: str | None) -> list[str]:
        """The job's unit on every node; when one node cannot start it, the others are stopped again."""
        by_name = {m.name: m for m in self.members}
        problems: list[str] = []
        self._record_start(in_unit=True)

        def begin(p: NodeLaunch) -> None:
            m = by_name[p.node.name]
            archive_path = f"{m.transport.workdir.rstrip('/')}/{code}" if code else None
            argv = detached.start_command(self.job_id, p.command, p.env, _work_dir(m.node, self.cwd), archive_path)
            got = m.transport.run(argv, timeout=60)
            if not got.ok:
                problems.append(f"{m.name}: {detached.start_problem(got.exit_status, got.stderr or got.cause())}")

        fanout(begin, self.plans, timeout=90, name=lambda p: p.node.name)
        if problems:
            fanout(
                lambda m: m.transport.run(detached.discard_command(self.job_id), timeout=60),
                self.members,
                timeout=90,
            )
            self._record_end()  # nothing runs from the directory any more
            where = (
                "on any node"
                if len(problems) == len(self.plans)
                else f"on {len(problems)} of {len(self.plans)} node(s), so it was stopped on the others"
            )
            raise NotStarted(f"the detached job could not start {where}: " + "; ".join(sorted(problems)))
        return [p.node.name for p in self.plans]

    def _record_start(self, in_unit: bool) -> None:
        """On every node, record that this launch's job runs from the compared directory, and its code; what
        appears there while it runs is its output, not compared by later launches (sameness)."""
        if not self.trees:
            return

        def record(m: Member) -> None:
            argv, given = sameness.begin_command(m.facts.python, self.trees[m.name], self.job_id, in_unit)
            if m.transport.run(argv, timeout=60, stdin=given).ok:
                with self._lock:
                    self._recorded.append(m)

        fanout(record, self.members, timeout=90, name=lambda m: m.name)

    # ------------------------------------------------------------------ ending

    def stop_all(self, skip: set[str] | None = None) -> None:
        """Kill every process this launch started, on every node (the run-marker sweep)."""
        fanout(
            lambda t: t.stop(),
            [t for name, t in self.transports.items() if name not in (skip or set())],
            timeout=60,
        )

    def close(self) -> None:
        """Every node cleaned up: this launch's processes killed, its work directory removed, disconnected."""

        def finish(transport: Transport) -> None:
            with contextlib.suppress(Exception):
                transport.cleanup()
            with contextlib.suppress(Exception):
                transport.close()

        if not self.options.detach:  # a foreground job ends with its launch; a detached one's end is on the node
            self._record_end()
        fanout(finish, list(self.transports.values()), timeout=60)

    def _record_end(self) -> None:
        def ended(m: Member) -> None:
            directory = self.trees[m.name].directory
            m.transport.run(sameness.end_command(m.facts.python, directory, self.job_id), timeout=30)

        fanout(ended, self._recorded, timeout=45)
        self._recorded = []

    def _each(self, function: Callable[[Member], None], what: str) -> None:
        answers = fanout(function, self.members, name=lambda m: m.name)
        for i, m in enumerate(self.members):
            answer = answers.get(i)
            if isinstance(answer, NotStarted):
                raise answer
            if isinstance(answer, TransportError | OSError):
                raise NotStarted(f"{m.name}: {what}: {answer}")
            if isinstance(answer, BaseException):
                raise answer


_CD = 'd=$1; shift; case "$d" in "~") d=$HOME ;; "~/"*) d="$HOME/${d#"~/"}" ;; esac; cd "$d" && exec "$@"'


def _work_dir(node: Node, cwd: str | None) -> str | None:
    """Where the job runs on NODE: CWD (--chdir, or the synced copy); without one, the current directory on the
    control machine itself (where the same-code check looked the script up) and the home directory over SSH
    (None: where the connection lands)."""
    if cwd:
        return cwd
    return os.getcwd() if node.is_local else None


def _in_dir(command: list[str], cwd: str | None) -> list[str]:
    """COMMAND run in CWD on the node (None: where the connection lands, the home directory)."""
    if not cwd:
        return command
    return ["sh", "-c", _CD, "sh", cwd, *command]


def _first_problem(results: list[CheckResult]) -> str | None:
    for r in results:
        if r.status.is_problem:
            return f"{r.name}{' on ' + r.host if r.host else ''}: {r.message}"
    return None


# ---------------------------------------------------------------------- detached jobs after the start


class Nodes:
    """Connections to NODES for jobs/logs/stop: a short-lived run id of its own, cleaned up at the end."""

    def __init__(self, nodes: list[Node], factory: Factory) -> None:
        self.nodes = nodes
        self.factory = factory
        self.run_id = new_run_id()
        self.transports: dict[str, Transport] = {}
        self.errors: dict[str, str] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Nodes:
        def one(node: Node) -> None:
            def register(transport: Transport) -> None:
                with self._lock:
                    self.transports[node.name] = transport

            try:
                self.factory(node, self.run_id, register)
            except HostKeyError:
                raise
            except TransportError as exc:
                with self._lock:
                    self.errors[node.name] = str(exc)
                    self.transports.pop(node.name, None)

        answers = fanout(one, self.nodes, name=lambda n: n.name)
        for answer in answers.values():
            if isinstance(answer, HostKeyError):
                self.__exit__()
                raise HostKeysRefused(str(answer))
        return self

    def __exit__(self, *exc: object) -> None:
        def finish(transport: Transport) -> None:
            with contextlib.suppress(Exception):
                transport.cleanup()
            with contextlib.suppress(Exception):
                transport.close()

        fanout(finish, list(self.transports.values()), timeout=60)

    def run(self, argv: Callable[[str], list[str]], timeout: float = 60) -> dict[str, CommandResult]:
        """ARGV(node name) on every reachable node at once."""
        reachable = [n for n in self.nodes if n.name in self.transports]
        answers = fanout(lambda n: self.transports[n.name].run(argv(n.name), timeout=timeout), reachable)
        out = {}
        for i, node in enumerate(reachable):
            answer = answers.get(i)
            out[node.name] = answer if isinstance(answer, CommandResult) else CommandResult(None, "", str(answer))
        return out

    def stream(
        self, argv: list[str], echo: Echo, first_ranks: dict[str, int | None] | None = None
    ) -> dict[str, CommandResult]:
        """ARGV on every reachable node, each node's output echoed as it arrives with node/rank prefixes."""
        lock = threading.Lock()
        reachable = [n for n in self.nodes if n.name in self.transports]

        def one(node: Node) -> CommandResult:
            sink = output.NodeOutput(node.name, (first_ranks or {}).get(node.name))

            def feed(stream: str, text: str) -> None:
                lines = sink.feed(stream, text)
                with lock:
                    for line in lines:
                        echo(line)

            result = self.transports[node.name].run(argv, timeout=FOREVER, on_output=feed)
            with lock:
                for line in sink.flush():
                    echo(line)
            return result

        answers = fanout(one, reachable, name=lambda n: n.name)
        return {
            node.name: a if isinstance(a, CommandResult) else CommandResult(None, "", str(a))
            for node, a in ((node, answers.get(i)) for i, node in enumerate(reachable))
        }
