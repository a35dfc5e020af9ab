#!/usr/bin/env python3
"""Fan-out: the core stage (`clustercheck run --only core`, as a user runs it) on 2, 4, 8, 16 and 64 nodes, and
the ratio of each size's wall time to 2 nodes' (goal for 16:2: 1.3 or less).

    benchmarks/fanout.py                      # the Docker test cluster: 64 nodes brought up, measured, taken down
    benchmarks/fanout.py --sizes 2,4,8,16     # a 16-node test cluster
    benchmarks/fanout.py --hosts INVENTORY    # your own nodes (the first N of the inventory for each size)
    benchmarks/fanout.py --against ../before  # this checkout and another one's clustercheck in the same rounds

The sizes are measured in interleaved rounds (2, 4, 8, 16, 64, then again), each size on the first N nodes of
one cluster, so load from elsewhere falls on every size alike; the figures are medians over the rounds. Beside
the wall time it reports the CPU time of the clustercheck process and, on the test cluster, the CPU time the
nodes' containers spent: all of it shares this machine's cores, so (control CPU + nodes' CPU) / cores is the
least wall time this machine can give a size, whatever clustercheck does in parallel. The controller's CPU time per
node is the largest size's clustercheck CPU less the smallest size's, over the nodes between them.

With --against CHECKOUT, every size is also run with the clustercheck of another source tree (CHECKOUT, put first on
PYTHONPATH, with this environment's packages), right after this checkout's in the same round: a before-and-after
comparison on a shared machine whose load moves from minute to minute.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common


def measure(nodes: common.Nodes, sizes: list[int], rounds: int, extra: list[str], against: str | None = None) -> dict:
    cpu = common.NodeCpu(nodes)
    variants: dict[str, dict[str, str] | None] = {"this checkout": None}
    if against:
        variants[against] = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [against, os.environ.get("PYTHONPATH")])),
        }
    samples: dict[str, dict[int, list[common.Timing]]] = {v: {n: [] for n in sizes} for v in variants}
    with tempfile.TemporaryDirectory(prefix="clustercheck-fanout-") as tmp:
        for round_ in range(rounds + 1):  # round 0 warms up (page cache, the nodes' python) and is not counted
            for size in sizes:
                for variant, env in variants.items():
                    names = nodes.names[:size]
                    run_dir = (
                        Path(tmp) / f"{size}-{round_}-{len(samples[variant][size])}-{list(variants).index(variant)}"
                    )
                    argv = common.core_stage(nodes, names, run_dir, *extra)
                    timing = common.timed(argv, cpu=cpu, names=names, env=env)
                    problem = common.reached_every_node(timing, names)
                    if problem:
                        raise common.BenchmarkError(f"the core stage on {size} nodes did not get through: {problem}")
                    label = "warm-up" if round_ == 0 else f"round {round_}/{rounds}"
                    node_cpu = "" if timing.node_cpu is None else f", nodes' CPU {timing.node_cpu:.2f} s"
                    which = f" [{variant}]" if against else ""
                    print(
                        f"  {label}: {size:3d} nodes {timing.wall:6.2f} s (clustercheck CPU {timing.cpu:.2f} s"
                        f"{node_cpu}){which}",
                        file=sys.stderr,
                    )
                    if round_:
                        samples[variant][size].append(timing)
    result = {variant: figures(by_size, sizes) for variant, by_size in samples.items()}
    return result["this checkout"] if not against else {"variants": result}


def figures(samples: dict[int, list[common.Timing]], sizes: list[int]) -> dict:
    """Medians over the rounds for each size, the ratios to the smallest size, and the controller's CPU per node."""
    cores = common.machine()["nproc"] or 1
    by_size = {}
    for size in sizes:
        walls = [t.wall for t in samples[size]]
        cpus = [t.cpu for t in samples[size]]
        node_cpus = [t.node_cpu for t in samples[size] if t.node_cpu is not None]
        entry = {
            "wall_s": walls,
            "cpu_s": cpus,
            "median_wall_s": common.median(walls),
            "median_cpu_s": common.median(cpus),
        }
        if node_cpus:
            entry["median_node_cpu_s"] = common.median(node_cpus)
            entry["cpu_floor_s"] = (entry["median_cpu_s"] + entry["median_node_cpu_s"]) / cores
        by_size[size] = entry
    base, top = sizes[0], sizes[-1]
    ratios = {f"{size}:{base}": by_size[size]["median_wall_s"] / by_size[base]["median_wall_s"] for size in sizes[1:]}
    per_node = (by_size[top]["median_cpu_s"] - by_size[base]["median_cpu_s"]) / (top - base)
    return {"sizes": by_size, "ratios": ratios, "controller_cpu_per_node_s": per_node}


def report(result: dict, info: dict) -> None:
    start = result.get("load_average_at_start", info["load_average"])[0]
    print(
        f"Fan-out: clustercheck run --only core, median of {result['rounds']} rounds; {common.describe(info)} "
        f"(at the start: {start:.2f})"
    )
    for variant, figures_ in result.get("variants", {"": result}).items():
        if variant:
            print(f"{variant}:")
        head = f"{'nodes':>5}  {'wall s':>7}  {'ratio':>5}  {'clustercheck CPU s':>18}  {'nodes CPU s':>11}"
        print(f"{head}  {'CPU floor s':>11}")
        sizes = figures_["sizes"]
        base = min(sizes)
        for size, f in sizes.items():
            ratio = f["median_wall_s"] / sizes[base]["median_wall_s"]
            node = f"{f['median_node_cpu_s']:11.2f}" if "median_node_cpu_s" in f else f"{'-':>11}"
            floor = f"{f['cpu_floor_s']:11.2f}" if "cpu_floor_s" in f else f"{'-':>11}"
            print(f"{size:5d}  {f['median_wall_s']:7.2f}  {ratio:5.2f}  {f['median_cpu_s']:18.2f}  {node}  {floor}")
        print("ratios: " + ", ".join(f"{k} = {v:.2f}" for k, v in figures_["ratios"].items()))
        print(f"clustercheck's CPU per node: {figures_['controller_cpu_per_node_s'] * 1000:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(
        __doc__.split("\n\n")[0], rounds=5, limit=True, epilog="Arguments after -- go to clustercheck run."
    )
    parser.add_argument("--sizes", default="2,4,8,16,64", help="node counts, smallest first (default %(default)s)")
    parser.add_argument(
        "--against", metavar="CHECKOUT", help="also run another source tree's clustercheck in the same rounds"
    )
    args, extra = parser.parse_known_args(argv)
    at_start = common.machine()
    extra = [a for a in extra if a != "--"]
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes {args.sizes}: give node counts, e.g. 2,4,8,16")
    if len(sizes) < 2 or sizes[0] < 1:
        parser.error("--sizes: at least two node counts, each 1 or more")
    if args.against:
        args.against = os.path.abspath(args.against)
    if args.against and not (Path(args.against) / "clustercheck" / "__main__.py").is_file():
        parser.error(f"--against {args.against}: not a clustercheck source tree (no clustercheck/__main__.py there)")
    if args.hosts:
        nodes = common.own_nodes(args.hosts, args.limit)
        if len(nodes.names) < sizes[-1]:
            parser.error(f"--sizes {args.sizes}: the inventory has {len(nodes.names)} node(s)")
        result = measure(nodes, sizes, args.rounds, extra, args.against)
    else:
        with common.test_cluster(sizes[-1], "-fanout", reuse=args.reuse, keep=args.keep) as nodes:
            result = measure(nodes, sizes, args.rounds, extra, args.against)
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
