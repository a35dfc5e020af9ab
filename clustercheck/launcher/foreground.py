"""A launched job in the foreground: torchrun on every node, each node's output streamed with node/rank prefixes
and kept per node; when one node's torchrun fails, the others get FAILURE_GRACE seconds, then every node's
processes are stopped, and the first failing node is named with its failing rank's own error."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from clustercheck.launcher import command as cmd
from clustercheck.launcher import output
from clustercheck.launcher.job import FOREVER, Echo, Finished, in_dir, work_dir
from clustercheck.stages import Member, rootcause
from clustercheck.stages.launch import NodeLaunch
from clustercheck.transport import CommandResult

FAILURE_GRACE = 5.0  # seconds the other nodes get to end on their own once one node's torchrun failed


def run(
    plans: list[NodeLaunch],
    members: list[Member],
    command: cmd.UserCommand,
    *,
    run_dir: Path,
    cwd: str | None,
    master_port: int,
    echo: Echo,
    say: Echo,
    stop_all: Callable[[set[str]], None],
) -> Finished:
    """PLANS started on their MEMBERS; STOP_ALL(nodes that already ended) stops every other node's processes."""
    by_name = {m.name: m for m in members}
    firsts = cmd.first_ranks(plans, command.elastic)
    outputs = {p.node.name: output.NodeOutput(p.node.name, firsts[p.node.name]) for p in plans}
    logs = {name: (run_dir / "hosts" / name / "output.log").open("a") for name in outputs}
    ends: dict[str, tuple[float, CommandResult, bool]] = {}
    lock = threading.Lock()
    failed = threading.Event()
    stopping = threading.Event()
    started = time.monotonic()

    def emit(name: str, lines: list[str]) -> None:
        with lock:
            for line in lines:
                echo(line)
                logs[name].write(line + "\n")
            logs[name].flush()

    def start(p: NodeLaunch) -> None:
        name = p.node.name
        m = by_name[name]
        sink = outputs[name]
        try:
            result = m.transport.run(
                in_dir(p.command, work_dir(m.node, cwd)),
                timeout=FOREVER,
                env=p.env,
                on_output=lambda stream, text: emit(name, sink.feed(stream, text)),
            )
        except Exception as exc:  # the connection broke: that node failed
            result = CommandResult(None, "", f"{type(exc).__name__}: {exc}")
        emit(name, sink.flush())
        with lock:
            ends[name] = (time.monotonic(), result, not stopping.is_set())
        if not result.ok:
            failed.set()

    threads = [threading.Thread(target=start, args=(p,), daemon=True, name=p.node.name) for p in plans]
    world = sum(p.nproc for p in plans)
    say(
        f"starting {command.script} on {len(plans)} node(s), "
        + (f"{world} rank(s)" if not command.elastic else "elastic")
        + f", master {plans[0].node.address}:{master_port}"
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
            stop_all(set(ends))
            for thread in threads:
                thread.join(30)
    finally:
        for fh in logs.values():
            with contextlib.suppress(OSError):
                fh.close()
    elapsed = time.monotonic() - started
    own = [(when, name, r) for name, (when, r, before) in ends.items() if before and not r.ok]
    if not own:
        if len(ends) == len(plans) and all(r.ok for _, r, _ in ends.values()):
            return Finished(0, f"the job completed on every node in {elapsed:.0f} s (output: {run_dir})")
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
