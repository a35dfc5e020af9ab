"""The whole verification against one short training job: `clustercheck run` (every stage, Lightning included)
against a 20-step DDP job started by hand with plain torchrun on the same nodes and ranks.

clustercheck side: `clustercheck run --hosts INVENTORY` as a user runs it (a subprocess, its JSON report read for
every stage's verdict and time), timed from start to exit. It must be READY: every torch stage PASS, Lightning's
included (the test nodes get Lightning installed beside torch).

By hand: the repository's `examples/train_ddp.py` (the README's example) put on every node beforehand (not timed),
then on every node at once over ssh, as a person would in one terminal per node: `python -m torch.distributed.run
--nnodes N --node-rank R --nproc-per-node K --master-addr FIRST --master-port P train_ddp.py --steps 20` with the
environment's python, K the ranks clustercheck ran per node (2 CPU ranks here, one per GPU on GPU nodes), timed
until the last node's torchrun returned.

The runs alternate (clustercheck first, then by hand first), --rounds pairs; the ratio is whole run / by hand per
pair, and the median of the pairs is the figure. Goal: 2 or less.

    .venv/bin/python benchmarks/whole_run.py [--hosts INVENTORY] [--rounds N] [--json FILE] [--against CHECKOUT]

--against CHECKOUT also runs another source tree's clustercheck (first on PYTHONPATH, with the same environment)
right after this one's in every pair, and gives its ratio against the same by-hand job.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

import common
from common import BenchmarkError, say

STEPS = 20
PORT = 29571  # the by-hand job's master port (clustercheck's default is 29500)
SCRIPT = "/tmp/ccbench-whole/train_ddp.py"  # not /tmp/clustercheck-*: clustercheck's sweep would take it for its own
TORCH_STAGES = ("collectives", "ddp", "lightning")


def example_script() -> bytes:
    """The repository's plain DDP example (examples/train_ddp.py)."""
    return (common.REPO / "examples" / "train_ddp.py").read_bytes()


def lightning_nodes(nodes: common.Nodes) -> None:
    """Lightning beside torch on the test nodes, as the cluster tests install it (tests/cluster/torchenv.py)."""
    import conftest
    import torchenv

    wheels = conftest.lightning_wheelhouse.__wrapped__(common.wheelhouse())
    errors = torchenv.install_packages(nodes.cluster, wheels, [torchenv.LIGHTNING_PIN])
    if errors:
        raise BenchmarkError("installing Lightning on the test nodes failed: " + "; ".join(errors))


def clustercheck_run(nodes: common.Nodes, run_dir: Path, cpu: common.NodeCpu, against: str | None = None) -> dict:
    """One whole `clustercheck run` (AGAINST: another source tree's, first on PYTHONPATH): its wall time, its CPU
    time and the nodes' (test cluster only), every stage's time, and each node's ranks and python."""
    argv = [common.clustercheck_exe(), "run", *nodes.clustercheck_args(), "--format", "json"]
    env = None
    if against:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [against, os.environ.get("PYTHONPATH")]))}
    timing = common.timed([*argv, "--run-dir", str(run_dir)], env=env, cpu=cpu, names=nodes.names)
    try:
        report = json.loads(timing.stdout)
    except ValueError:
        raise BenchmarkError(
            f"clustercheck wrote no report (exit {timing.returncode}): {timing.stderr[-1500:]}"
        ) from None
    stages = {s["name"]: s for s in report["stages"]}
    failed = [n for n in TORCH_STAGES if stages.get(n, {}).get("status") not in ("PASS", "WARN")]
    if timing.returncode != 0 or failed:
        problems = [f"{c['name']}: {c['message']}" for c in report["checks"] if c["status"] in ("FAIL", "ERROR")]
        raise BenchmarkError(f"clustercheck's run is not READY (stages {failed}): {'; '.join(problems)[:1500]}")
    ranks = next(c for c in report["checks"] if c["name"] == "ddp_equivalence")["data"]["world_size"]
    pythons = {c["host"]: c["data"]["python"] for c in report["checks"] if c["name"] == "torch.import"}
    return {
        "run_s": round(timing.wall, 3),
        "controller_cpu_s": round(timing.cpu, 3),
        "nodes_cpu_s": None if timing.node_cpu is None else round(timing.node_cpu, 3),
        "stages_s": {name: round(s.get("duration_s") or 0.0, 3) for name, s in stages.items()},
        "ranks": ranks,
        "pythons": pythons,
    }


def by_hand_commands(nodes: common.Nodes, ranks: int, pythons: dict[str, str]) -> dict[str, str]:
    """Each node's plain torchrun line: the same nodes, ranks per node and python as clustercheck's run."""
    per_node = ranks // len(nodes.nodes)
    first = nodes.nodes[0].address
    out = {}
    for rank, node in enumerate(nodes.nodes):
        words = [pythons[node.name], "-m", "torch.distributed.run", "--nnodes", str(len(nodes.nodes))]
        words += ["--node-rank", str(rank), "--nproc-per-node", str(per_node), "--master-addr", first]
        words += ["--master-port", str(PORT), SCRIPT, "--steps", str(STEPS)]
        out[node.name] = shlex.join(words)
    return out


def main() -> int:
    parser = common.parser(__doc__.split("\n\n")[0], rounds=5)
    parser.add_argument(
        "--against", metavar="CHECKOUT", help="also run another source tree's clustercheck in every pair"
    )
    args = parser.parse_args()
    if args.against:
        args.against = os.path.abspath(args.against)
        if not (Path(args.against) / "clustercheck" / "__main__.py").is_file():
            parser.error(f"--against {args.against}: not a clustercheck source tree (no clustercheck/__main__.py)")
    doc: dict = {"benchmark": "whole_run", "machine": common.machine(), "against": args.against, "pairs": []}
    with common.torch_nodes(args) as nodes, tempfile.TemporaryDirectory(prefix="whole-bench-") as tmp:
        if nodes.cluster is not None:
            lightning_nodes(nodes)
        doc["nodes"] = [n.name for n in nodes.nodes]
        for node in nodes.nodes:
            common.put(node, example_script(), SCRIPT)
        commands: dict[str, str] = {}
        cpu = common.NodeCpu(nodes)

        def clustercheck_side(i: int) -> dict:
            cc = clustercheck_run(nodes, Path(tmp) / f"run-{i}", cpu)
            if not commands:  # the first pair starts with clustercheck: its ranks are the by-hand job's
                commands.update(by_hand_commands(nodes, cc["ranks"], cc["pythons"]))
            cc.pop("pythons")
            if args.against:  # the other checkout right after this one, in the same pair
                other = clustercheck_run(nodes, Path(tmp) / f"against-{i}", cpu, args.against)
                cc.update(against_run_s=other["run_s"], against_stages_s=other["stages_s"])
                cc.update(against_nodes_cpu_s=other["nodes_cpu_s"])
            return cc

        def by_hand_side(i: int) -> dict:
            before = cpu.read(nodes.names)
            seconds = common.on_every_node(nodes.nodes, commands)
            after = cpu.read(nodes.names)
            used = None if before is None or after is None else round(after - before, 3)
            return {"by_hand_s": round(seconds, 3), "by_hand_nodes_cpu_s": used}

        for i, pair in enumerate(common.pairs(args.rounds, clustercheck_side, "by hand", by_hand_side)):
            pair["ratio"] = round(pair["run_s"] / pair["by_hand_s"], 3)
            if args.against:
                pair["against_ratio"] = round(pair["against_run_s"] / pair["by_hand_s"], 3)
            say(f"pair {i + 1}: {pair}")
            doc["pairs"].append(pair)
        doc["by_hand_commands"] = commands
        for node in nodes.nodes:
            common.ssh(node, f"rm -rf {shlex.quote(str(Path(SCRIPT).parent))}")
    pairs = doc["pairs"]
    doc["median"] = {k: common.median([p[k] for p in pairs]) for k in ("run_s", "controller_cpu_s", "by_hand_s")}
    for key in ("nodes_cpu_s", "by_hand_nodes_cpu_s", "against_nodes_cpu_s"):
        known = [p[key] for p in pairs if p.get(key) is not None]
        doc["median"][key] = common.median(known) if known else None
    doc["median"]["ratio"] = common.median([p["ratio"] for p in pairs])
    if args.against:
        doc["median"]["against_run_s"] = common.median([p["against_run_s"] for p in pairs])
        doc["median"]["against_ratio"] = common.median([p["against_ratio"] for p in pairs])
    stages = list(pairs[0]["stages_s"])
    doc["median"]["stages_s"] = {s: common.median([p["stages_s"].get(s, 0.0) for p in pairs]) for s in stages}
    doc["machine_after"] = common.machine()
    med = doc["median"]
    print(f"machine: {common.describe(doc['machine'])}")
    print(f"nodes: {', '.join(doc['nodes'])}")
    print("pair  clustercheck run  by hand (torchrun, 20 steps)  ratio  stages (s)")
    for i, p in enumerate(pairs, 1):
        times = " ".join(f"{s} {t:.1f}" for s, t in p["stages_s"].items() if t)
        print(f"{i:4}  {p['run_s']:14.2f} s  {p['by_hand_s']:26.2f} s  {p['ratio']:.3f}  {times}")
    verdict = "meets" if med["ratio"] <= 2 else "misses"
    print(
        f"median: whole run {med['run_s']:.2f} s ({med['controller_cpu_s']:.2f} s of CPU on this machine), by hand "
        f"{med['by_hand_s']:.2f} s, ratio {med['ratio']:.3f} (goal 2 or less: {verdict} it)"
    )
    print("median stage times: " + ", ".join(f"{s} {t:.2f} s" for s, t in med["stages_s"].items()))
    if med["nodes_cpu_s"] is not None:
        print(
            f"the nodes' CPU time (median): the whole run {med['nodes_cpu_s']:.1f} s, "
            f"by hand {med['by_hand_nodes_cpu_s']:.1f} s"
        )
    if args.against:
        print(
            f"--against {args.against}: whole run {med['against_run_s']:.2f} s, ratio {med['against_ratio']:.3f} "
            f"(each pair: {', '.join(str(p['against_ratio']) for p in pairs)})"
        )
    common.write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(common.run("whole_run", main))
