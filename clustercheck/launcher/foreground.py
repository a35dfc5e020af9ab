"""A launched job in the foreground on the one torch-job runner (stages/runner.py): torchrun on every node, each
node's output streamed with node/rank prefixes and kept per node; when one node's torchrun fails, the others get
the runner's failure grace, then every node's processes are stopped, and the first failing node is named with its
failing rank's own error."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from clustercheck.facts.model import NodeFacts
from clustercheck.launcher import command as cmd
from clustercheck.launcher import output
from clustercheck.launcher.job import FOREVER, Echo, Finished, in_dir, work_dir
from clustercheck.reach import Reach
from clustercheck.stages import Member, rootcause, runner
from clustercheck.stages.launch import NodeLaunch
from clustercheck.transport import OutputSink


def run(
    plans: list[NodeLaunch],
    members: list[Member],
    command: cmd.UserCommand,
    reach: Reach,
    *,
    run_dir: Path,
    cwd: str | None,
    master_port: int,
    echo: Echo,
    say: Echo,
) -> Finished:
    """PLANS started on their MEMBERS through REACH by the one torch-job runner, with no deadline of ours."""
    firsts = cmd.first_ranks(plans, command.elastic)
    outputs = {p.node.name: output.NodeOutput(p.node.name, firsts[p.node.name]) for p in plans}
    logs = {name: (run_dir / "hosts" / name / "output.log").open("a") for name in outputs}
    lock = threading.Lock()

    def emit(name: str, lines: list[str]) -> None:
        with lock:
            log = logs.get(name)  # none once the job is over: an interrupted node's last lines are shown, not kept
            for line in lines:
                echo(line)
                if log is not None:
                    log.write(line + "\n")
            if log is not None:
                log.flush()

    def streamed(name: str) -> OutputSink:
        return lambda stream, text: emit(name, outputs[name].feed(stream, text))

    world = sum(p.nproc for p in plans)
    say(
        f"starting {command.script} on {len(plans)} node(s), "
        + (f"{world} rank(s)" if not command.elastic else "elastic")
        + f", master {plans[0].node.address}:{master_port}"
    )
    started = time.monotonic()
    try:
        ran = runner.run(
            plans,
            members,
            reach,
            timeout=FOREVER,
            argv=lambda p, m: in_dir(p.command, work_dir(m.node, cwd)),
            output=streamed,
            ended=lambda name, result: emit(name, outputs[name].flush()),
        )
    finally:
        with lock:
            for fh in logs.values():
                with contextlib.suppress(OSError):
                    fh.close()
            logs.clear()
    elapsed = time.monotonic() - started
    ends = ran.ends
    raw = {name: "\n".join(o.recent) for name, o in outputs.items()}
    first = runner.first_failure(ends, lambda name, result: rootcause.node_failure(raw[name]))
    if first is None:
        if len(ends) == len(plans) and all(r.ok for _, r, _ in ends.values()):
            return Finished(0, f"the job completed on every node in {elapsed:.0f} s (output: {run_dir})")
        return Finished(1, "the job ended without an exit status from every node; every node was stopped")
    name, result = first
    status = result.exit_status if result.exit_status is not None else 1
    why = "no exit status: killed or disconnected" if result.exit_status is None else f"exit {result.exit_status}"
    failure = rootcause.node_failure(raw[name])
    ranks = {n: rootcause.rank_ends(text) for n, text in raw.items()}  # how each rank of each node ended
    if failure is not None:  # the failing rank's own error, not torchrun's report of it
        said = f"{name}'s {failure.text()}"
        facts = next(m.facts for m in members if m.name == name)
        said += "".join(f". {note}" for note in told(failure, name, facts, ends, ranks, plans, command.elastic))
    else:
        said = f"Last lines from {name}: " + (
            " | ".join(outputs[name].tail) or (result.stderr.strip().splitlines() or [""])[-1]
        )
    alike = rootcause.same_status(ranks, {p.node.name: p.nproc for p in plans})
    if alike is not None and alike != status:
        said += f". Every rank failed alike: exit {alike}, the script's own status (torchrun's: {status})"
        status = alike
    return Finished(
        status,
        f"the job failed on {name} first ({why}) after {elapsed:.0f} s; every node's torchrun was stopped. {said}",
    )


def told(
    failure: rootcause.RankFailure,
    name: str,
    facts: NodeFacts,
    ends: runner.Ends,
    ranks: dict[str, dict[int, rootcause.RankEnd]],
    plans: list[NodeLaunch],
    elastic: bool,
) -> list[str]:
    """What clustercheck knows of FAILURE, the failing rank of node NAME (FACTS: what it collected there): a GPU
    or CUDA build the script asked for and the node lacks; whether the job's work had finished, from how the nodes'
    torchruns (ENDS) and the other ranks (RANKS) ended and rank 0's last line; what is known of the rank's last
    words."""
    notes = []
    lacking = rootcause.without_cuda(failure, name, facts)
    if lacking:
        notes.append(lacking)
    known = rootcause.known_cause(failure)
    if known is not None and known[1] and failure.signal is not None:
        others = [
            end
            for n, node_ends in ranks.items()
            for local, end in node_ends.items()
            if (n, local) != (name, failure.local_rank)
        ]
        nodes_failed = [n for n, (_, result, own) in ends.items() if n != name and own and not result.ok]
        if not nodes_failed and not any(end.failed for end in others):
            first = plans[0].node.name
            zero = ranks.get(first, {}).get(0)
            last = (
                f" (rank 0's last line: {zero.said[-1]!r})"
                if zero is not None and zero.said and not elastic and (first, 0) != (name, failure.local_rank)
                else ""
            )
            who = f"rank {failure.rank}" if failure.rank is not None else f"local rank {failure.local_rank}"
            notes.append(f"No other rank failed on its own{last}: the job's work had finished before {who} ended")
    if known is not None:
        notes.append(f"Known of its last words: {known[0]}")
    return notes
