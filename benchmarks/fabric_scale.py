#!/usr/bin/env python3
"""The fabric pair rounds at scale: `clustercheck run --only collectives` on N test nodes (default 64) with torch
and one or more rails, with the pair rounds left out (`--skip 'fabric.p*'`), with them, and with them while one
node's rail is shaped to 100 Mbit/s by tc.

For each case: the collectives stage's time (the torch job: its start, the all-node sweep, the pair rounds), the
run's wall time, and what fabric.pairs and fabric.paths said. The rounds' cost is the difference between the first
two cases (with --without: one run each, one after the other, on the same nodes); the rounds' own time in the job
(the slowest rank's, fabric.paths' data) is measured in every run.

    benchmarks/fabric_scale.py                       # 64 Debian 12 nodes with torch and one rail, up and down
    benchmarks/fabric_scale.py --nodes 16 --rails 2 --nproc 2 --keep
"""

from __future__ import annotations

import json
import subprocess
import time

import common
import torchenv  # tests/cluster is on the path (common.py)

SLOWED = "node2"
TC = "tc qdisc add dev {iface} root tbf rate 100mbit burst 32kbit latency 400ms"


def collectives_run(nodes: common.Nodes, run_dir: str, nproc: int, *extra: str) -> dict:
    argv = [common.clustercheck_exe(), "run", *nodes.clustercheck_args(), "--only", "collectives"]
    argv += [
        "--skip",
        "local.*",
        "--nproc-per-node",
        str(nproc),
        "--timeout",
        "900",
        "--command-timeout",
        "600",
        "--stall-timeout",  # 64 nodes importing torch at once on two cores: minutes before the first heartbeat
        "600",
        *extra,
    ]
    argv += ["--format", "json", "--run-dir", run_dir]
    timing = common.timed(argv)
    try:
        report = json.loads(timing.stdout)
    except json.JSONDecodeError as exc:
        raise common.BenchmarkError(f"no JSON report (exit {timing.returncode}): {timing.stderr[-800:]}") from exc
    stage = next((s.get("duration_s") for s in report["stages"] if s["name"] == "collectives"), None)
    found = [
        f"{c['status']} {c['name']}{'@' + c['host'] if c['host'] else ''}: {c['message'][:240]}"
        for c in report["checks"]
        if c["name"].startswith(("fabric.p", "allreduce")) and c["status"] not in ("PASS", "SKIP")
    ]
    figures = sum(
        len((c.get("data") or {}).get("rails") or []) for c in report["checks"] if c["name"] == "fabric.pairs"
    )
    paths = next((c for c in report["checks"] if c["name"] == "fabric.paths"), {})
    return {
        "pair_rounds_s": (paths.get("data") or {}).get("seconds"),
        "wall_s": round(timing.wall, 1),
        "collectives_stage_s": stage,
        "exit": timing.returncode,
        "rail_figures": figures,
        "node_pairs": len({frozenset(e[:2]) for e in (paths.get("data") or {}).get("edges") or []}),
        "named": found,
    }


def main() -> int:
    p = common.parser(__doc__.split("\n\n")[0], 1)
    p.add_argument("--nodes", type=int, default=64, help="test nodes (default %(default)s)")
    p.add_argument("--rails", type=int, default=1, help="rails per node (default %(default)s)")
    p.add_argument("--nproc", type=int, default=1, help="ranks per node (default %(default)s)")
    p.add_argument("--without", action="store_true", help="also a run with the pair rounds left out, first")
    args = p.parse_args()
    results = {"machine": common.machine(), "nodes": args.nodes, "rails": args.rails, "nproc": args.nproc}
    image = torchenv.node_image(common.wheelhouse())
    with common.test_cluster(
        args.nodes, "-fabric", reuse=args.reuse, keep=args.keep, image=image, rails=args.rails
    ) as nodes:
        python = ["--python", torchenv.PYTHON]  # the node image's torch environment
        base = f"/tmp/fabric-scale-{int(time.time())}"
        cases = results["cases"] = {}
        if args.without:
            cases["without_pairs"] = collectives_run(
                nodes, f"{base}/without", args.nproc, *python, "--skip", "fabric.p*"
            )
            common.say(f"without the pair rounds: {cases['without_pairs']}")
        cases["with_pairs"] = collectives_run(nodes, f"{base}/with", args.nproc, *python)
        common.say(f"with the pair rounds: {cases['with_pairs']}")
        iface = f"eth{args.rails}"
        container = nodes.containers[SLOWED]
        subprocess.run(["docker", "exec", container, "sh", "-c", TC.format(iface=iface)], check=True)
        try:
            cases["slowed"] = collectives_run(nodes, f"{base}/slowed", args.nproc, *python)
        finally:
            subprocess.run(["docker", "exec", container, "tc", "qdisc", "del", "dev", iface, "root"], check=False)
        cases["slowed"]["rail"] = f"{SLOWED} {iface}"
        common.say(f"{SLOWED}'s {iface} shaped to 100 Mbit/s: {cases['slowed']}")
        with_s = cases["with_pairs"]["collectives_stage_s"]
        without_s = cases.get("without_pairs", {}).get("collectives_stage_s")
        if with_s is not None and without_s is not None:
            results["pair_rounds_added_s"] = round(with_s - without_s, 1)
    print(json.dumps(results, indent=2))
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run("fabric_scale", main))
