"""Overhead of the DDP stage: clustercheck's DDP stage against the same torchrun job started by hand over SSH.

clustercheck side: a run selecting the DDP stage only (`clustercheck run --only ddp`, driven through the same
Pipeline the command line builds), timed from the moment the stage starts to the moment it hands back its results
(the pipeline's progress callback: the stage's start, then the cleanup's start). That is everything the stage does:
the torchrun lines, the job, the progress watchdog, the rank logs and records brought back, the judging.

By hand: the torchrun line clustercheck recorded for each node (hosts/<node>/torch.command in its run directory: the
same node-side DDP program, world size, steps, backend, interfaces and environment), its work directory replaced by
one of the benchmark's, where the same node-side bundle was put beforehand; started on every node at once with
`ssh node '<line>'`, timed until the last node's torchrun returned. Nothing is fetched afterwards: a person would
look at the output.

The runs alternate (clustercheck first, then by hand first), --rounds pairs; the ratio is stage / by hand per pair,
and the median of the pairs is the figure. Goal: 1.2 or less.

    .venv/bin/python benchmarks/ddp_overhead.py [--hosts INVENTORY] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import re
import resource
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

import common
from common import BenchmarkError, say

from clustercheck.checks import ddp
from clustercheck.config import RunConfig
from clustercheck.model import Status
from clustercheck.reach import Fanout
from clustercheck.run.pipeline import Pipeline
from clustercheck.selection import Selection
from clustercheck.stages import bundle
from clustercheck.transport import factory
from clustercheck.transport.params import SshSettings, load_config

BY_HAND_DIR = "/tmp/ccbench-ddp"  # not /tmp/clustercheck-*: clustercheck's leftover sweep would take it for its own
WORKDIR = re.compile(r"/tmp/clustercheck-[A-Za-z0-9_.-]+")


def clustercheck_ddp(nodes: common.Nodes, run_dir: Path) -> dict:
    """One `clustercheck run --only ddp`: the DDP stage's wall time, the whole run's, the verdict, and the torchrun
    line it recorded for every node."""
    marks: dict[str, float] = {}  # wall-clock times, comparable with the run directory's file times
    lock = threading.Lock()

    cpu: dict[str, float] = {}  # this process's CPU time (all its threads): the controller's own cost

    def progress(host: str, what: str) -> None:
        now, used = time.time(), time.process_time()
        with lock:
            marks.setdefault(what, now)
            cpu.setdefault(what, used)

    config = RunConfig(
        run_dir=run_dir, selection=Selection(only=("ddp",)), ssh=SshSettings(config=load_config(nodes.ssh_config))
    )
    started = time.monotonic()
    outcome = Pipeline(nodes.nodes, config, Fanout(factory.default(config.ssh)), progress).run()
    total = time.monotonic() - started
    verdict = [r for r in outcome.results if r.name == ddp.NAME]
    if not verdict or verdict[0].status is not Status.PASS or "ddp" not in marks:
        why = verdict[0].message if verdict else "; ".join(r.message for r in outcome.results if r.status.is_problem)
        raise BenchmarkError(f"clustercheck's DDP stage did not pass: {why}")
    hosts = [run_dir / "hosts" / n.name for n in nodes.nodes]
    commands = {n.name: (run_dir / "hosts" / n.name / "torch.command").read_text().strip() for n in nodes.nodes}
    # Where the stage's time goes, from when it wrote each node's torchrun line (just before starting the jobs)
    # and each node's torchrun log (as it brings back the results, node after node).
    lines_written = max((h / "torch.command").stat().st_mtime for h in hosts)
    first_log = min((h / "torch.torchrun.log").stat().st_mtime for h in hosts)
    end = marks["cleaning up"]
    return {
        "stage": end - marks["ddp"],
        "total": total,
        "before_jobs": lines_written - marks["ddp"],
        "jobs": first_log - lines_written,
        "after_jobs": end - first_log,
        "controller_cpu": cpu["cleaning up"] - cpu["ddp"],
        "commands": commands,
    }


def by_hand_commands(recorded: dict[str, str]) -> dict[str, str]:
    """clustercheck's torchrun lines with its (removed) work directory replaced by the benchmark's."""
    out = {}
    for name, line in recorded.items():
        if not WORKDIR.search(line):
            raise BenchmarkError(f"{name}: no work directory in the recorded torchrun line: {line}")
        out[name] = WORKDIR.sub(BY_HAND_DIR, line)
    return out


def prepare_by_hand(nodes: common.Nodes) -> None:
    """The node-side bundle into the benchmark's directory on every node (not timed: a person copies it once)."""
    for node in nodes.nodes:
        common.ssh(node, f"rm -rf {BY_HAND_DIR}")
        common.put(node, bundle.bundle(), bundle.path(BY_HAND_DIR))


def by_hand(nodes: common.Nodes, commands: dict[str, str]) -> tuple[float, float]:
    """The by-hand job's wall time, and the CPU time its ssh clients used on this machine."""
    for node in nodes.nodes:  # the previous job's outputs, out of the way (not timed)
        common.ssh(node, f"rm -rf {shlex.quote(BY_HAND_DIR)}/torch {BY_HAND_DIR}/nccl-*.log")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = common.on_every_node(nodes.nodes, commands)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return seconds, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def main() -> int:
    args = common.parser(__doc__.split("\n\n")[0], rounds=7).parse_args()
    doc: dict = {"benchmark": "ddp_overhead", "machine": common.machine(), "pairs": []}
    with common.torch_nodes(args) as nodes, tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        doc["nodes"] = [n.name for n in nodes.nodes]
        prepare_by_hand(nodes)
        commands: dict[str, str] = {}

        def clustercheck_side(i: int) -> dict:
            cc = clustercheck_ddp(nodes, Path(tmp) / f"run-{i}")
            if not commands:  # the first pair starts with clustercheck: its lines are the by-hand job's
                commands.update(by_hand_commands(cc["commands"]))
            parts = ("stage", "before_jobs", "jobs", "after_jobs", "controller_cpu")
            return {**{f"{k}_s": round(cc[k], 3) for k in parts}, "run_s": round(cc["total"], 3)}

        def by_hand_side(i: int) -> dict:
            seconds, used = by_hand(nodes, commands)
            return {"by_hand_s": round(seconds, 3), "by_hand_cpu_s": round(used, 3)}

        for i, pair in enumerate(common.pairs(args.rounds, clustercheck_side, "by hand", by_hand_side)):
            pair["ratio"] = round(pair["stage_s"] / pair["by_hand_s"], 3)
            say(f"pair {i + 1}: {pair}")
            doc["pairs"].append(pair)
        doc["by_hand_commands"] = commands
        for node in nodes.nodes:
            common.ssh(node, f"rm -rf {BY_HAND_DIR}")
    pairs = doc["pairs"]
    keys = ("stage_s", "before_jobs_s", "jobs_s", "after_jobs_s", "controller_cpu_s", "run_s", "by_hand_s")
    keys += ("by_hand_cpu_s", "ratio")
    doc["median"] = {k: common.median([p[k] for p in pairs]) for k in keys}
    doc["machine_after"] = common.machine()
    med = doc["median"]
    print(f"machine: {common.describe(doc['machine'])}")
    print(f"nodes: {', '.join(doc['nodes'])}")
    print("pair  clustercheck DDP stage  (whole run)  by hand over ssh  ratio")
    for i, p in enumerate(pairs, 1):
        print(f"{i:4}  {p['stage_s']:20.2f} s  ({p['run_s']:6.2f} s)  {p['by_hand_s']:14.2f} s  {p['ratio']:.3f}")
    print(
        f"the stage's median time: {med['before_jobs_s']:.2f} s before the jobs start, {med['jobs_s']:.2f} s of jobs, "
        f"{med['after_jobs_s']:.2f} s bringing back logs and records; {med['controller_cpu_s']:.2f} s of CPU on this "
        f"machine (by hand: {med['by_hand_cpu_s']:.2f} s for the ssh clients)"
    )
    verdict = "meets" if med["ratio"] <= 1.2 else "misses"
    print(
        f"median: stage {med['stage_s']:.2f} s, by hand {med['by_hand_s']:.2f} s, ratio {med['ratio']:.3f} "
        f"(goal 1.2 or less: {verdict} it)"
    )
    common.write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(common.run("ddp_overhead", main))
