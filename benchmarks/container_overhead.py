#!/usr/bin/env python3
"""What `--container IMAGE` costs: `clustercheck run --hosts localhost` with the torch side inside IMAGE against the
same run with the machine's own environment, in alternating order, the whole run and each stage timed (the JSON
report's stage durations), the ratio taken round by round.

    python3 benchmarks/container_overhead.py IMAGE [--rounds 5] [--container-option OPT ...] [--json FILE]

IMAGE should hold the same torch as the python running clustercheck (tests/cluster/nodeimages.py's
ensure_torch_image builds one: the test nodes' Debian 12 with the CPU torch wheel), so that the difference is the
container: the extra `docker image inspect`, the environment read inside the image and a `docker run` per torch job.
One warm-up round is not counted; the figures are medians. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

STAGES = ("core", "collectives", "ddp")


def one_run(extra: list[str], port: int) -> dict:
    """One `clustercheck run --hosts localhost` with EXTRA options: wall seconds and each stage's seconds."""
    with tempfile.TemporaryDirectory(prefix="container-bench-") as tmp:
        argv = ["clustercheck", "run", "--hosts", "localhost", "--skip", "lightning", "--format", "json"]
        argv += ["--run-dir", os.path.join(tmp, "run"), "--master-port", str(port), *extra]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, errors="replace")
        wall = time.monotonic() - started
    if proc.returncode not in (0, 1):
        sys.exit(f"clustercheck exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    report = json.loads(proc.stdout)
    stages = {s["name"]: s.get("duration_s", 0.0) for s in report["stages"]}
    return {"wall": wall, "status": report["status"], **{s: stages.get(s, 0.0) for s in STAGES}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("image", help="the image to run the torch side in (on this machine's Docker)")
    p.add_argument("--rounds", type=int, default=5, help="measured rounds (default %(default)s)")
    p.add_argument("--container-option", action="append", default=[], metavar="OPT", help="passed on (repeatable)")
    p.add_argument("--json", metavar="FILE", help="write the rounds and medians here")
    args = p.parse_args()
    if shutil.which("clustercheck") is None:
        sys.exit("clustercheck is not on PATH")
    inside = ["--container", args.image, *(f"--container-option={o}" for o in args.container_option)]
    rounds = []
    for i in range(args.rounds + 1):
        host = one_run([], 29661)
        boxed = one_run(inside, 29662)
        if i:  # the first round warms the caches
            rounds.append({"host": host, "container": boxed})
            print(f"round {i}: wall {host['wall']:.1f} s on the host, {boxed['wall']:.1f} s in the image", flush=True)
    medians = {
        side: {k: statistics.median(r[side][k] for r in rounds) for k in ("wall", *STAGES)}
        for side in ("host", "container")
    }
    ratio = statistics.median(r["container"]["wall"] / r["host"]["wall"] for r in rounds)
    for k in ("wall", *STAGES):
        print(f"{k:12s} host {medians['host'][k]:6.2f} s   image {medians['container'][k]:6.2f} s")
    print(f"wall ratio image/host (median of the rounds' ratios): {ratio:.2f}")
    if args.json:
        machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "image": args.image}
        document = {"machine": machine, "rounds": rounds, "medians": medians, "wall_ratio": ratio}
        with open(args.json, "w") as fh:
            json.dump(document, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
