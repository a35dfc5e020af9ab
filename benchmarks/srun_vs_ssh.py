#!/usr/bin/env python3
"""clustercheck through Slurm against clustercheck over SSH, on the same nodes: the core stage (and with --all,
the whole run), run in alternating order, timed as wall clock and as the CPU time of the control side (clustercheck
and what it starts on the login node: srun for the Slurm side, nothing but itself over SSH).

    salloc --nodes=N python3 srun_vs_ssh.py --hosts INVENTORY [--rounds 5] [--network] [--all] [--skip GLOB]
        [--json FILE]

It runs on the login node (the Slurm test cluster's controller, or yours), inside an allocation of the inventory's
nodes, with the `clustercheck` on PATH: `clustercheck run --hosts INVENTORY` over SSH beside `clustercheck run
--slurm --hosts INVENTORY` through job steps of the allocation, so both reach the same nodes with the same checks.
One warm-up round is not counted; the figures are medians. --network adds the network stage (every pair of
nodes), --all the whole run; --skip passes checks to leave out to both sides (`--skip 'torch.*'` on nodes without
torch). Standard library only, so that it runs where
clustercheck is installed without the repository.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def timed(argv: list[str], cwd: str) -> dict:
    """ARGV's wall time, CPU time (user + system of it and its children) and exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, errors="replace")
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "returncode": proc.returncode, "stderr": proc.stderr[-400:]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", metavar="INVENTORY", required=True, help="the nodes, all in the current allocation")
    p.add_argument("--rounds", metavar="N", type=int, default=5, help="measured rounds (default %(default)s)")
    p.add_argument("--network", action="store_true", help="the network stage as well as the core stage")
    p.add_argument("--all", action="store_true", help="the whole run (every stage) as well as the core stage")
    p.add_argument("--skip", metavar="GLOB", action="append", default=[], help="checks both sides leave out")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = p.parse_args()
    if not os.environ.get("SLURM_JOB_ID"):
        print("srun_vs_ssh: error: run it inside an allocation (salloc --nodes=N ...)", file=sys.stderr)
        return 1
    exe = shutil.which("clustercheck")
    if exe is None:
        print("srun_vs_ssh: error: no clustercheck on PATH", file=sys.stderr)
        return 1
    inventory = os.path.abspath(args.hosts)
    skips = [arg for glob in args.skip for arg in ("--skip", glob)]
    kinds = {"core": ["--only", "core", *skips]}
    if args.network:
        kinds["network"] = ["--only", "network", *skips]
    if args.all:
        kinds["whole run"] = skips
    samples: dict[str, list[dict]] = {}
    nodes = None
    with tempfile.TemporaryDirectory(prefix="srun-vs-ssh-") as tmp:
        for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
            for kind, extra in kinds.items():
                sides = {
                    "ssh": [exe, "run", "--hosts", inventory, *extra],
                    "srun": [exe, "run", "--slurm", "--hosts", inventory, *extra],
                }
                for side in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
                    run_dir = os.path.join(tmp, f"{kind}-{side}-{round_}".replace(" ", "-"))
                    argv = [*sides[side], "--format", "json", "-o", os.path.join(tmp, "report.json")]
                    timing = timed([*argv, "--run-dir", run_dir], tmp)
                    if timing["returncode"] not in (0, 1):
                        raise SystemExit(f"srun_vs_ssh: error: {side} {kind} exited {timing['returncode']}: "
                                         f"{timing['stderr']}")  # fmt: skip
                    with open(os.path.join(tmp, "report.json")) as fh:
                        nodes = len(json.load(fh)["hosts"])
                    if round_:
                        samples.setdefault(f"{kind}|{side}", []).append(timing)
            print(f"round {round_} done", file=sys.stderr, flush=True)
    figures = {}
    for key, timings in samples.items():
        kind, side = key.split("|")
        wall = statistics.median(t["wall"] for t in timings)
        cpu = statistics.median(t["cpu"] for t in timings)
        figures.setdefault(kind, {})[side] = {
            "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3),
            "cpu_ms_per_node": round(1000 * cpu / nodes, 1),
            "exit_codes": sorted({t["returncode"] for t in timings}),
        }
    print(f"{nodes} nodes, {args.rounds} rounds, Python {platform.python_version()}, {os.cpu_count()} CPUs")
    print("| what | via | wall s (median) | control CPU s | CPU ms per node | srun/ssh wall |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for kind, sides in figures.items():
        for side, f in sides.items():
            ratio = f["wall_s"] / sides["ssh"]["wall_s"] if side == "srun" else 1.0
            print(f"| {kind} | {side} | {f['wall_s']:.2f} | {f['cpu_s']:.2f} | {f['cpu_ms_per_node']:.0f} | "
                  f"{ratio:.2f} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"nodes": nodes, "rounds": args.rounds, "figures": figures, "samples": samples}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
