"""The one runner of a torch job across nodes, for the torch stages (stages/torchjob.py) and for `clustercheck
launch` in the foreground (launcher/foreground.py): each node's torchrun line (stages/launch.py's plan) started on
every node at once through the Reach, watched, and when one node's torchrun fails the others get FAILURE_GRACE
seconds to report their own failure, then every node still running is stopped (the run-marker sweep).

With a Watch, the progress watchdog (stages/watchdog.py) polls every node's rank heartbeats: a node whose ranks
stop while the others wait for them, a node that stops answering at all (before its ranks beat too), or a job
where no rank moves on, is named within the stall timeout, and the job is stopped everywhere at once. A node that
no longer answers is neither stopped nor waited for (it is `silent`).

What the runner hands back is what happened on each node; how a job's end is told (a stage's findings, a
launch's exit status) is its caller's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from clustercheck.checks import waits
from clustercheck.reach import Reach, Started
from clustercheck.stages import Member, launch, nodeprogram, rootcause, watchdog
from clustercheck.transport import CommandResult, OutputSink

FAILURE_GRACE = 5.0  # seconds the other nodes get to report their own failure before they are stopped
POLL_INTERVAL = 5.0  # seconds between two heartbeat polls of a node (at most a quarter of the stall timeout)
JOIN_WAIT = 30.0  # seconds a stopped node's torchrun gets to hand back its end
SOCKETS_WAIT = 10.0  # seconds the nodes get to show a stalled job's connections before it is stopped

# node -> (when its torchrun ended, its result, whether it ended on its own: before the runner stopped it)
Ends = dict[str, tuple[float, CommandResult, bool]]


@dataclass(frozen=True)
class Watch:
    """The progress watchdog for a job whose ranks write heartbeats under STAGE in each node's work directory."""

    stage: str
    stall_timeout: float


@dataclass
class Ran:
    """What became of a job on each node."""

    ends: Ends
    failed: bool  # a node's torchrun failed (or the watchdog stopped the job): every node was stopped
    stall: watchdog.Stall | None = None
    silent: set[str] = field(default_factory=set)  # nodes that no longer answered when the job was stopped


def run(
    plans: list[launch.NodeLaunch],
    members: list[Member],
    reach: Reach,
    *,
    timeout: float,
    argv: Callable[[launch.NodeLaunch, Member], list[str]] | None = None,
    output: Callable[[str], OutputSink | None] | None = None,
    ended: Callable[[str, CommandResult], None] | None = None,
    watch: Watch | None = None,
) -> Ran:
    """PLANS started on their MEMBERS through REACH, all within TIMEOUT seconds. ARGV(plan, member): the command
    run there (default: the plan's torchrun line); OUTPUT(node): where that node's output streams as it arrives
    (None: kept in its result); ENDED(node, result) is called as a node's torchrun ends."""
    job = Job(members, watch, ended)
    job.start(plans, reach, timeout, argv, output)
    try:
        stall = job.watch_until_end()
        if stall is not None:
            stall = job.explained(stall)
    finally:
        job.done.set()
    return job.stop(reach, stall)


class Job:
    """One torch job under way on its members: each node's end as it comes, the watchdog's polls of the ranks'
    heartbeats (with a Watch), and, once it ended or failed, every node still running stopped."""

    def __init__(
        self, members: list[Member], watch: Watch | None, ended: Callable[[str, CommandResult], None] | None
    ) -> None:
        self.members = members
        self.by_name = {m.name: m for m in members}
        self.watch = watch
        self.ended = ended
        self.lock = threading.Lock()
        self.failed = threading.Event()  # a node's torchrun failed, or the watchdog named a stall
        self.stopping = threading.Event()  # the runner stops the job: what ends now did not end on its own
        self.done = threading.Event()  # the polls end
        self.ends: Ends = {}
        self.started: list[Started] = []
        channels = {m.name: m.transport.channel for m in members}
        self.dog = watchdog.Watchdog(channels, watch.stall_timeout, time.monotonic()) if watch else None

    def start(
        self,
        plans: list[launch.NodeLaunch],
        reach: Reach,
        timeout: float,
        argv: Callable[[launch.NodeLaunch, Member], list[str]] | None,
        output: Callable[[str], OutputSink | None] | None,
    ) -> None:
        """Every node's line started at once, all within TIMEOUT seconds; with a watch, every node's poll."""
        deadline = time.monotonic() + timeout
        for p in plans:
            m = self.by_name[p.node.name]
            self.started.append(
                reach.start(
                    m.name,
                    m.transport,
                    argv(p, m) if argv else p.command,
                    timeout=max(1.0, deadline - time.monotonic()),
                    env=p.env,
                    on_output=output(m.name) if output else None,
                    ended=self.end,
                )
            )
        if self.dog is not None:
            for m in self.members:
                threading.Thread(target=self.poll, args=(m,), daemon=True, name=f"{m.name} watchdog").start()

    def end(self, name: str, result: CommandResult) -> None:
        """NAME's torchrun ended with RESULT."""
        if self.ended is not None:
            self.ended(name, result)
        with self.lock:
            self.ends[name] = (time.monotonic(), result, not self.stopping.is_set())
        if not result.ok:
            self.failed.set()

    def poll(self, m: Member) -> None:
        """M's ranks' heartbeats, every POLL_INTERVAL (at most a quarter of the stall timeout), to the watchdog;
        a node that does not answer within the stall timeout is stopped anyway."""
        assert self.watch is not None and self.dog is not None
        command = launch.progress_command(m.facts.python, m.transport.workdir, self.watch.stage)
        while not self.done.wait(min(POLL_INTERVAL, self.watch.stall_timeout / 4)):
            with self.lock:
                self.dog.polling(m.name, time.monotonic())
            try:
                answer = nodeprogram.call(m.transport, command, program="heartbeats", timeout=self.watch.stall_timeout)
                beats = launch.heartbeats(answer.value)
            except Exception:
                beats = None
            with self.lock:
                self.dog.observe(m.name, beats, time.monotonic())

    def watch_until_end(self) -> watchdog.Stall | None:
        """Until every node's torchrun ended, or one failed, or the watchdog named a stall (returned). After a
        failure the other nodes get FAILURE_GRACE seconds to report their own view (a killed rank's node says
        "Signal 9")."""
        stall = None
        while any(s.alive() for s in self.started) and not self.failed.is_set():
            time.sleep(0.1)
            stall = self.stalled()
            if stall:
                self.failed.set()
        if self.failed.is_set() and not stall:
            grace = time.monotonic() + FAILURE_GRACE
            while any(s.alive() for s in self.started) and time.monotonic() < grace:
                time.sleep(0.1)
        return stall

    def stalled(self) -> watchdog.Stall | None:
        """The stall the watchdog names now, told which nodes' torchrun ended (those nodes answered)."""
        if self.dog is None:
            return None
        now = time.monotonic()
        with self.lock:
            for name, (_, result, _) in self.ends.items():
                if result.exit_status is not None:  # its torchrun's end came back: the node answered
                    self.dog.ended(name, now)
            return self.dog.stall(now)

    def explained(self, stall: watchdog.Stall) -> watchdog.Stall:
        """STALL with what its ranks' connections say (checks/waits.py), read on every node while the job still
        runs, within SOCKETS_WAIT; as it was when no rank waits to connect or nothing could be read."""
        assert self.watch is not None
        rows: dict[str, list[list[str]]] = {}

        def read(m: Member) -> None:
            command = launch.progress_command(m.facts.python, m.transport.workdir, self.watch.stage, sockets=True)
            answer = nodeprogram.call(m.transport, command, program="heartbeats", timeout=SOCKETS_WAIT)
            beats = launch.heartbeats(answer.value) or {}
            rows[m.name] = [b["tcp"] for b in beats.values() if isinstance(b.get("tcp"), list)]

        with self.lock:  # a node that does not answer now would not answer this either
            now = time.monotonic()
            answering = [m for m in self.members if self.dog is None or self.dog.nodes[m.name].answers(now)]
        readers = [threading.Thread(target=read, args=(m,), daemon=True) for m in answering]
        for reader in readers:
            reader.start()
        give_up = time.monotonic() + SOCKETS_WAIT + 2
        for reader in readers:
            reader.join(max(0.0, give_up - time.monotonic()))
        addresses = {  # the cluster address, the inventory's, and every address of the node's interfaces
            m.name: {m.address, m.node.address, *(str(a.address.ip) for a in m.facts.addresses or [])}
            for m in self.members
        }
        rules = {m.name: m.facts.firewall.port_rules if m.facts.firewall else () for m in self.members}
        found = waits.explain(dict(rows), addresses, rules)
        if found is None:
            return stall
        nodes, said, data = found
        return replace(
            stall,
            nodes=nodes or stall.nodes,
            message=f"{said} (the watchdog: {stall.message})",
            data={**stall.data, "connections": data, **({"stalled_nodes": list(nodes)} if nodes else {})},
        )

    def silent(self, now: float, stall: watchdog.Stall | None) -> set[str]:
        """The nodes of a failed job that no longer answer (their torchrun's end did not come back either): known
        not to answer (watchdog.NodeState.silent), or named by the STALL and not answering now. A node whose first
        poll has not come back yet, in a job that failed in its first seconds, is not one of them."""
        if self.dog is None or not self.failed.is_set():
            return set()
        named = set(stall.nodes) if stall is not None else set()
        return {
            n
            for n in self.by_name
            if (self.dog.nodes[n].silent(now) or (n in named and not self.dog.nodes[n].answers(now)))
            and (n not in self.ends or self.ends[n][1].exit_status is None)
        }

    def stop(self, reach: Reach, stall: watchdog.Stall | None) -> Ran:
        """After a failure, every node still running stopped (the run-marker sweep) and its end waited for, but
        the nodes that no longer answer: neither stopped nor waited for."""
        with self.lock:
            silent = self.silent(time.monotonic(), stall)
            self.stopping.set()
            ending = set(self.ends)
        if self.failed.is_set():
            reach.stop([m.transport for m in self.members if m.name not in ending and m.name not in silent])
            for s in self.started:
                if s.name not in silent:
                    s.join(JOIN_WAIT)
        with self.lock:
            return Ran(dict(self.ends), self.failed.is_set(), stall, silent)


def first_failure(
    ends: Ends, cause: Callable[[str, CommandResult], rootcause.RankFailure | None] | None = None
) -> tuple[str, CommandResult] | None:
    """The node whose torchrun failed first, of those that ended on their own (not stopped by us, not at the
    deadline): a node whose rank failed on its own account (its own error, or killed by a signal) is the root
    cause its peers' errors follow from; otherwise the earliest. CAUSE(node, result): the failing rank's own error
    in that node's output (default: read from the result's output)."""
    cause = cause or (lambda name, result: node_cause(result))
    own = [(when, name, result) for name, (when, result, before_stop) in ends.items() if before_stop]
    failed = [f for f in own if not f[2].ok and not f[2].timed_out]
    if not failed:
        return None

    def its_own(name: str, result: CommandResult) -> bool:
        found = cause(name, result)
        return found is not None and found.own

    _, name, result = min(failed, key=lambda f: (not its_own(f[1], f[2]), f[0]))
    return name, result


def node_cause(result: CommandResult) -> rootcause.RankFailure | None:
    """The failing rank's own error in a node's torchrun output."""
    return rootcause.node_failure(result.stdout + "\n" + result.stderr)
