#!/usr/bin/env python3
"""The network stage at scale: `clustercheck run --only network` on N test nodes (default 64) healthy, with one node's
egress slowed by tc, and with one node frozen (`docker pause`) during the measurement rounds.

For each case: the stage's wall time, the verdict, and what the run named (the slow node, the frozen node's pairs).
The frozen node is paused as soon as its probe has the go signal (the shared deadline) plus --freeze-after seconds,
so the pause lands in the connections or the rounds, and is unpaused after the run.

    benchmarks/network_scale.py                  # 64 Debian 12 test nodes, brought up and taken down
    benchmarks/network_scale.py --nodes 16 --keep

The machine's kernel limits are raised as the test suite does (tests/harness.py raise_machine_limits): one kernel
holds every test node's neighbour entries here.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import common
from harness import freeze_after_go  # tests/ is on the path (common.py)

SLOWED = "node2"
FROZEN = "node3"
TC = "tc qdisc add dev eth0 root tbf rate {rate} burst 64kb latency 50ms"


def network_run(nodes: common.Nodes, run_dir: str) -> tuple[float, int, dict]:
    argv = [common.clustercheck_exe(), "run", *nodes.clustercheck_args(), "--only", "network"]
    argv += ["--skip", "torch.*", "--skip", "local.*", "--format", "json", "--run-dir", run_dir]
    timing = common.timed(argv)
    try:
        report = json.loads(timing.stdout)
    except json.JSONDecodeError as exc:
        raise common.BenchmarkError(f"no JSON report (exit {timing.returncode}): {timing.stderr[-500:]}") from exc
    return timing.wall, timing.returncode, report


def named(report: dict) -> list[str]:
    """The network checks that did not pass, with their messages."""
    return [
        f"{c['status']} {c['name']}{'@' + c['host'] if c['host'] else ''}: {c['message'][:300]}"
        for c in report["checks"]
        if c["name"].startswith("network.") and c["status"] != "PASS"
    ]


def docker_exec(container: str, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True)


def main() -> int:
    p = common.parser(__doc__.split("\n\n")[0], 1)
    p.add_argument("--nodes", type=int, default=64, help="test nodes (default %(default)s)")
    p.add_argument("--rate", default="50mbit", help="the slowed node's egress rate (default %(default)s)")
    p.add_argument("--freeze-after", type=float, default=5.0, help="seconds after the go signal (default %(default)s)")
    args = p.parse_args()
    results = {"machine": common.machine(), "nodes": args.nodes, "cases": {}}
    with common.test_cluster(args.nodes, "-netscale", reuse=args.reuse, keep=args.keep) as nodes:
        common.raise_limits()
        base = f"/tmp/network-scale-{int(time.time())}"

        wall, rc, report = network_run(nodes, f"{base}/healthy")
        results["cases"]["healthy"] = {"seconds": round(wall, 1), "exit": rc, "named": named(report)}
        common.say(f"healthy: {wall:.1f} s, exit {rc}; {named(report)}")

        slowed = nodes.containers[SLOWED]
        docker_exec(slowed, TC.format(rate=args.rate))
        try:
            wall, rc, report = network_run(nodes, f"{base}/slowed")
        finally:
            docker_exec(slowed, "tc qdisc del dev eth0 root")
        results["cases"]["slowed"] = {"node": SLOWED, "seconds": round(wall, 1), "exit": rc, "named": named(report)}
        common.say(f"{SLOWED} slowed to {args.rate}: {wall:.1f} s, exit {rc}; {named(report)}")

        done, frozen = threading.Event(), []
        freezer = threading.Thread(
            target=freeze_after_go, args=(nodes.containers[FROZEN], FROZEN, args.freeze_after, done, frozen)
        )
        freezer.start()
        try:
            started = time.monotonic()
            wall, rc, report = network_run(nodes, f"{base}/frozen")
        finally:
            done.set()
            freezer.join()
        after = round(frozen[0] - started, 1) if frozen else None
        results["cases"]["frozen"] = {
            "node": FROZEN,
            "frozen_after_seconds": after,
            "seconds": round(wall, 1),
            "exit": rc,
            "named": named(report),
        }
        common.say(f"{FROZEN} frozen {after} s into the run: {wall:.1f} s, exit {rc}; {named(report)}")
    print(json.dumps(results, indent=2))
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run("network_scale", main))
