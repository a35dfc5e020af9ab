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
from dataclasses import dataclass, field

from clustercheck.reach import Reach, Started
from clustercheck.stages import Member, launch, rootcause, watchdog
from clustercheck.transport import CommandResult, OutputSink

FAILURE_GRACE = 5.0  # seconds the other nodes get to report their own failure before they are stopped
POLL_INTERVAL = 5.0  # seconds between two heartbeat polls of a node (at most a quarter of the stall timeout)
JOIN_WAIT = 30.0  # seconds a stopped node's torchrun gets to hand back its end

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
    by_name = {m.name: m for m in members}
    lock = threading.Lock()
    failed = threading.Event()
    stopping = threading.Event()
    ends: Ends = {}
    deadline = time.monotonic() + timeout

    def end(name: str, result: CommandResult) -> None:
        if ended is not None:
            ended(name, result)
        with lock:
            ends[name] = (time.monotonic(), result, not stopping.is_set())
        if not result.ok:
            failed.set()

    started: list[Started] = []
    for p in plans:
        m = by_name[p.node.name]
        started.append(
            reach.start(
                m.name,
                m.transport,
                argv(p, m) if argv else p.command,
                timeout=max(1.0, deadline - time.monotonic()),
                env=p.env,
                on_output=output(m.name) if output else None,
                ended=end,
            )
        )

    channels = {m.name: m.transport.channel for m in members}
    dog = watchdog.Watchdog(channels, watch.stall_timeout, time.monotonic()) if watch else None
    done = threading.Event()

    def poll(m: Member) -> None:
        assert watch is not None and dog is not None
        command = launch.progress_command(m.facts.python, m.transport.workdir, watch.stage)
        while not done.wait(min(POLL_INTERVAL, watch.stall_timeout / 4)):
            with lock:
                dog.polling(m.name, time.monotonic())
            try:  # a node that does not answer within the stall timeout is stopped anyway
                answer = m.transport.run(command, timeout=watch.stall_timeout)
                beats = launch.parse_progress(answer.stdout) if answer.ok else None
            except Exception:
                beats = None
            with lock:
                dog.observe(m.name, beats, time.monotonic())

    if dog is not None:
        for m in members:
            threading.Thread(target=poll, args=(m,), daemon=True, name=f"{m.name} watchdog").start()
    stall: watchdog.Stall | None = None
    try:
        while any(s.alive() for s in started) and not failed.is_set():
            time.sleep(0.1)
            if dog is None:
                continue
            now = time.monotonic()
            with lock:
                for name, (_, result, _) in ends.items():
                    if result.exit_status is not None:  # its torchrun's end came back: the node answered
                        dog.ended(name, now)
                stall = dog.stall(now)
            if stall:
                failed.set()
        if failed.is_set() and not stall:
            # Give the other nodes a moment to report their own view (a killed rank's node says "Signal 9"),
            # then stop every torchrun still running, on every node.
            grace = time.monotonic() + FAILURE_GRACE
            while any(s.alive() for s in started) and time.monotonic() < grace:
                time.sleep(0.1)
    finally:
        done.set()
    with lock:  # the nodes that stopped answering: neither stopped nor waited for
        now = time.monotonic()
        silent = {
            n
            for n in by_name
            if dog is not None
            and failed.is_set()
            and not dog.nodes[n].answers(now)
            and (n not in ends or ends[n][1].exit_status is None)
        }
        stopping.set()
        ending = set(ends)
    if failed.is_set():
        reach.stop([m.transport for m in members if m.name not in ending and m.name not in silent])
        for s in started:
            if s.name not in silent:
                s.join(JOIN_WAIT)
    with lock:
        return Ran(dict(ends), failed.is_set(), stall, silent)


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
