#!/usr/bin/env python3
"""Fan-out: the core stage (`clustercheck run --only core`, as a user runs it) on 2, 4, 8, 16 and 64 nodes, and
the ratio of each size's wall time to 2 nodes' (goal for 16:2: 1.3 or less).

    benchmarks/fanout.py                      # the Docker test cluster: 64 nodes brought up, measured, taken down
    benchmarks/fanout.py --sizes 2,4,8,16     # a 16-node test cluster
    benchmarks/fanout.py --hosts INVENTORY    # your own nodes (the first N of the inventory for each size)

The sizes are measured in interleaved rounds (2, 4, 8, 16, 64, then again), each size on the first N nodes of
one cluster, so load from elsewhere falls on every size alike; the figures are medians over the rounds. Beside
the wall time it reports the CPU time of the clustercheck process and, on the test cluster, the CPU time the
nodes' containers spent: all of it shares this machine's cores, so (control CPU + nodes' CPU) / cores is the
least wall time this machine can give a size, whatever clustercheck does in parallel.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def measure(nodes: common.Nodes, sizes: list[int], rounds: int, extra: list[str]) -> dict:
    cpu = common.NodeCpu(nodes)
    samples: dict[int, list[common.Timing]] = {n: [] for n in sizes}
    with tempfile.TemporaryDirectory(prefix="clustercheck-fanout-") as tmp:
        for round_ in range(rounds + 1):  # round 0 warms up (page cache, the nodes' python) and is not counted
            for size in sizes:
                names = nodes.names[:size]
                run_dir = Path(tmp) / f"{size}-{round_}"
                timing = common.timed(common.core_stage(nodes, names, run_dir, *extra), cpu=cpu, names=names)
                problem = common.reached_every_node(timing, names)
                if problem:
                    raise common.BenchmarkError(f"the core stage on {size} nodes did not get through: {problem}")
                label = "warm-up" if round_ == 0 else f"round {round_}/{rounds}"
                node_cpu = "" if timing.node_cpu is None else f", nodes' CPU {timing.node_cpu:.2f} s"
                print(
                    f"  {label}: {size:3d} nodes {timing.wall:6.2f} s (clustercheck CPU {timing.cpu:.2f} s{node_cpu})",
                    file=sys.stderr,
                )
                if round_:
                    samples[size].append(timing)
    cores = common.machine()["nproc"] or 1
    figures = {}
    for size in sizes:
        walls = [t.wall for t in samples[size]]
        cpus = [t.cpu for t in samples[size]]
        node_cpus = [t.node_cpu for t in samples[size] if t.node_cpu is not None]
        entry = {"wall_s": walls, "median_wall_s": common.median(walls), "median_cpu_s": common.median(cpus)}
        if node_cpus:
            entry["median_node_cpu_s"] = common.median(node_cpus)
            entry["cpu_floor_s"] = (entry["median_cpu_s"] + entry["median_node_cpu_s"]) / cores
        figures[size] = entry
    base = sizes[0]
    ratios = {f"{size}:{base}": figures[size]["median_wall_s"] / figures[base]["median_wall_s"] for size in sizes[1:]}
    return {"sizes": figures, "ratios": ratios}


def report(result: dict, info: dict) -> None:
    start = result.get("load_average_at_start", info["load_average"])[0]
    print(
        f"Fan-out: clustercheck run --only core, median of {result['rounds']} rounds; {common.describe(info)} "
        f"(at the start: {start:.2f})"
    )
    head = f"{'nodes':>5}  {'wall s':>7}  {'ratio':>5}  {'clustercheck CPU s':>18}  {'nodes CPU s':>11}"
    print(f"{head}  {'CPU floor s':>11}")
    sizes = result["sizes"]
    base = min(sizes)
    for size, f in sizes.items():
        ratio = f["median_wall_s"] / sizes[base]["median_wall_s"]
        node = f"{f['median_node_cpu_s']:11.2f}" if "median_node_cpu_s" in f else f"{'-':>11}"
        floor = f"{f['cpu_floor_s']:11.2f}" if "cpu_floor_s" in f else f"{'-':>11}"
        print(f"{size:5d}  {f['median_wall_s']:7.2f}  {ratio:5.2f}  {f['median_cpu_s']:18.2f}  {node}  {floor}")
    print("ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in result["ratios"].items()))


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(
        __doc__.split("\n\n")[0], rounds=5, limit=True, epilog="Arguments after -- go to clustercheck run."
    )
    parser.add_argument("--sizes", default="2,4,8,16,64", help="node counts, smallest first (default %(default)s)")
    args, extra = parser.parse_known_args(argv)
    at_start = common.machine()
    extra = [a for a in extra if a != "--"]
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes {args.sizes}: give node counts, e.g. 2,4,8,16")
    if len(sizes) < 2 or sizes[0] < 1:
        parser.error("--sizes: at least two node counts, each 1 or more")
    if args.hosts:
        nodes = common.own_nodes(args.hosts, args.limit)
        if len(nodes.names) < sizes[-1]:
            parser.error(f"--sizes {args.sizes}: the inventory has {len(nodes.names)} node(s)")
        result = measure(nodes, sizes, args.rounds, extra)
    else:
        with common.test_cluster(sizes[-1], "-fanout", reuse=args.reuse, keep=args.keep) as nodes:
            result = measure(nodes, sizes, args.rounds, extra)
    info = common.machine()
    hosts = args.hosts or "test cluster"
    result = {
        "benchmark": "fanout",
        "rounds": args.rounds,
        "machine": info,
        "load_average_at_start": at_start["load_average"],
        "hosts": hosts,
        **result,
    }
    report(result, info)
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(common.run("fanout", main))
