"""Bandwidth accuracy: clustercheck's all_reduce busbw against a plain torch.distributed timing loop.

clustercheck side: `clustercheck run --only collectives --format json -o FILE`, as a user runs it; the busbw per
message size is the `allreduce.bandwidth` check's data in the JSON report, and the warm-up and timed call counts
come from rank 0's record in the run directory.

Reference: benchmarks/allreduce_reference.py (nccl-tests' definitions, written for this benchmark, no code shared
with clustercheck), started under torchrun by hand over ssh on every node with the torchrun line clustercheck
recorded for its collectives job (hosts/<node>/torch.command: same nodes, ranks, backend, interfaces and
environment), only the program and its arguments replaced: the same sizes and call counts.

The runs alternate (clustercheck first, then the reference first), --rounds pairs; per size the ratio is
clustercheck / reference per pair, median over the pairs. Goal: every size within 0.9 to 1.1.

    .venv/bin/python benchmarks/busbw.py [--hosts INVENTORY] [--rounds N] [--json FILE]
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import common
from common import BenchmarkError, say

from clustercheck.stages import bundle

HERE = Path(__file__).resolve().parent
REF_DIR = "/tmp/ccbench-busbw"  # not /tmp/clustercheck-*: clustercheck's leftover sweep would take it for its own
REF_SCRIPT = f"{REF_DIR}/allreduce_reference.py"
REF_OUT = f"{REF_DIR}/rows.json"
MEDIANS = ("clustercheck", "reference", "ratio", "reference_slowest_rank", "ratio_slowest_rank")
WORKDIR = re.compile(r"/tmp/clustercheck-[A-Za-z0-9_.-]+")


def clustercheck_busbw(nodes: common.Nodes, run_dir: Path) -> dict:
    """One `clustercheck run --only collectives`: the all_reduce rows of its JSON report, its call counts and
    the torchrun line it recorded for every node."""
    run_dir.mkdir(parents=True)
    out = run_dir / "report.json"
    cmd = [common.clustercheck_exe(), "run", *nodes.clustercheck_args(), "--only", "collectives", "--format", "json"]
    cmd += ["-o", str(out), "--run-dir", str(run_dir / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if not out.exists():
        raise BenchmarkError(f"clustercheck wrote no report (exit {proc.returncode}): {proc.stderr[-1500:]}")
    check = next((c for c in json.loads(out.read_text())["checks"] if c["name"] == "allreduce.bandwidth"), None)
    if check is None or "sizes" not in check.get("data", {}):
        raise BenchmarkError(f"no allreduce.bandwidth figures in clustercheck's report: {check}")
    first = nodes.nodes[0].name
    record = json.loads((run_dir / "run" / "hosts" / first / "torch" / "collectives" / "rank-0.json").read_text())
    hosts = run_dir / "run" / "hosts"
    return {
        "rows": check["data"]["sizes"],
        "ranks": check["data"]["ranks"],
        "backend": check["data"]["backend"],
        "warmup": record["bandwidth"]["warmup"],
        "iters": record["bandwidth"]["iters"],
        "commands": {n.name: (hosts / n.name / "torch.command").read_text().strip() for n in nodes.nodes},
    }


def reference_commands(recorded: dict[str, str], sizes: list[int], warmup: int, iters: int, backend: str) -> dict:
    """clustercheck's torchrun lines with the program replaced by the reference and its work directory by ours."""
    out = {}
    for name, line in recorded.items():
        words = shlex.split(line)
        at = next((i for i, w in enumerate(words) if w.endswith("/" + bundle.FILE)), None)
        if at is None:
            raise BenchmarkError(f"{name}: no clustercheck program in the recorded torchrun line: {line}")
        words = [WORKDIR.sub(REF_DIR, w) for w in words[:at]]
        words += [REF_SCRIPT, "--sizes", ",".join(map(str, sizes)), "--warmup", str(warmup), "--iters", str(iters)]
        words += ["--backend", backend, "--out", REF_OUT]
        out[name] = shlex.join(words)
    return out


def reference(nodes: common.Nodes, commands: dict[str, str]) -> dict:
    for node in nodes.nodes:
        common.ssh(node, f"rm -f {REF_OUT}; rm -rf {REF_DIR}/collectives")
    common.on_every_node(nodes.nodes, commands)
    return json.loads(common.ssh(nodes.nodes[0], f"cat {REF_OUT}"))


def main() -> int:
    args = common.parser(__doc__.split("\n\n")[0], rounds=7).parse_args()
    doc: dict = {"benchmark": "busbw", "machine": common.machine(), "pairs": []}
    with common.torch_nodes(args) as nodes, tempfile.TemporaryDirectory(prefix="busbw-bench-") as tmp:
        doc["nodes"] = [n.name for n in nodes.nodes]
        for node in nodes.nodes:
            common.put(node, (HERE / "allreduce_reference.py").read_bytes(), REF_SCRIPT)
        commands: dict[str, str] = {}

        def clustercheck_side(i: int) -> dict:
            cc = clustercheck_busbw(nodes, Path(tmp) / f"run-{i}")
            if not commands:
                sizes = [r["bytes"] for r in cc["rows"]]
                commands.update(reference_commands(cc["commands"], sizes, cc["warmup"], cc["iters"], cc["backend"]))
                doc.update(ranks=cc["ranks"], backend=cc["backend"], warmup=cc["warmup"], iters=cc["iters"])
                doc["reference_commands"] = commands
            return {"clustercheck": {r["bytes"]: r["busbw_gbps"] for r in cc["rows"]}}

        def reference_side(i: int) -> dict:
            rows = reference(nodes, commands)["rows"]
            return {
                "reference": {r["bytes"]: r["busbw_gbps"] for r in rows},
                "reference_slowest_rank": {r["bytes"]: r["busbw_slowest_rank_gbps"] for r in rows},
            }

        for i, pair in enumerate(common.pairs(args.rounds, clustercheck_side, "reference", reference_side)):
            for ratio, reference_key in (("ratio", "reference"), ("ratio_slowest_rank", "reference_slowest_rank")):
                pair[ratio] = {s: pair["clustercheck"][s] / pair[reference_key][s] for s in pair["clustercheck"]}
            say(f"pair {i + 1} ({pair['order']}): " + _row(pair["ratio"]))
            doc["pairs"].append(pair)
        for node in nodes.nodes:
            common.ssh(node, f"rm -rf {REF_DIR}")
    pairs = doc["pairs"]
    sizes = sorted(pairs[0]["ratio"])
    doc["median"] = {s: {k: common.median([p[k][s] for p in pairs]) for k in MEDIANS} for s in sizes}
    doc["machine_after"] = common.machine()
    print(f"machine: {common.describe(doc['machine'])}")
    print(f"nodes: {', '.join(doc['nodes'])}; {doc['ranks']} ranks over {doc['backend']}")
    print(f"{doc['warmup']} warm-up and {doc['iters']} timed calls per size; medians of {len(pairs)} pairs")
    print("      size  clustercheck busbw  reference busbw   ratio  (reference, slowest rank's time: busbw, ratio)")
    for s in sizes:
        m = doc["median"][s]
        print(
            f"{s:10}  {m['clustercheck']:13.4f} GB/s  {m['reference']:10.4f} GB/s  {m['ratio']:6.3f}"
            f"  ({m['reference_slowest_rank']:.4f} GB/s, {m['ratio_slowest_rank']:.3f})"
        )
    print("run-to-run spread of each measurement over the pairs (highest / lowest busbw):")
    for s in sizes:
        cc, ref = ([p[k][s] for p in pairs] for k in ("clustercheck", "reference"))
        doc["median"][s]["spread"] = {"clustercheck": max(cc) / min(cc), "reference": max(ref) / min(ref)}
        print(f"{s:10}  clustercheck {max(cc) / min(cc):5.2f}x  reference {max(ref) / min(ref):5.2f}x")
    outside = [s for s in sizes if not 0.9 <= doc["median"][s]["ratio"] <= 1.1]
    print("goal 0.9 to 1.1 at every size: " + ("met" if not outside else f"missed at {outside}"))
    common.write_json(args.json, {**doc, "pairs": [{k: _jsonable(v) for k, v in p.items()} for p in pairs]})
    return 0


def _row(ratios: dict) -> str:
    return ", ".join(f"{s}: {r:.3f}" for s, r in sorted(ratios.items()))


def _jsonable(value):
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


if __name__ == "__main__":
    sys.exit(common.run("busbw", main))
