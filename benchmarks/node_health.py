#!/usr/bin/env python3
"""The node health program against LBNL NHC on the same node: `clustercheck node-health` (every per-node check of
the core stage, torch's import included) against NHC run from its checkout with the comparable checks (goal:
clustercheck's at most 1 s on an idle node, and never near Slurm's 60 s under load).

    benchmarks/node_health.py --nhc NHC_CHECKOUT [--rounds 7] [--load N] [--json FILE]

It runs on this machine, as a health program runs on its node (as root for the firewall probes). Each round runs
node-health as slurmd runs it every interval (torch's import reused from the round before), node-health importing
torch (--torch-max-age 0: its first run, or after a change), NHC and, as the floor of that import,
`PYTHON -c 'import torch'` with the environment's python, in alternating order; one warm-up round is not counted;
the figures are medians. --load N keeps N processes spinning on the CPU meanwhile (a node busy with other work).
Without --nhc, clustercheck is timed alone.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

from clustercheck.stages.core import RECORDED_PYTHON

# NHC's checks that match node-health's (https://github.com/mej/nhc, README "Supported Checks"), one per line of
# its configuration; `* ||` runs a line on every host. nvidia-smi only where it is installed, as gpu.* SKIP without.
NHC_CHECKS = [
    ("check_fs_mount_rw -f /", "the root file system is mounted read-write (facts: the collector writes there)"),
    ("check_fs_free / 1GB", "disk.free on /"),
    ("check_fs_free /tmp 1GB", "disk.free on /tmp"),
    ("check_fs_size /dev/shm 256MB", "shm.size"),
    ("check_hw_physmem 1GB 64TB", "os.info (memory read)"),
    ("check_ps_service -u _chrony chronyd", "time.sync (chronyd runs)"),
    ("check_cmd_status -t 10 -r 0 getent hosts $HOSTNAME", "hostname.resolve"),
    ("check_cmd_status -t 10 -r 0 iptables -S", "firewall (its rules read)"),
]
NVIDIA_SMI_CHECK = ("check_cmd_status -t 10 -r 0 nvidia-smi -q", "gpu.* (nvidia-smi -q answers)")


def nhc_config(path: Path) -> list[tuple[str, str]]:
    checks = NHC_CHECKS + ([NVIDIA_SMI_CHECK] if shutil.which("nvidia-smi") else [])
    path.write_text("".join(f"* || {line}\n" for line, _ in checks))
    return checks


def nhc_argv(checkout: Path, config: Path, status: Path) -> list[str]:
    """NHC from its checkout: every check run (-a), the log to stdout, nothing marked offline in a scheduler."""
    return [
        "bash", str(checkout / "nhc"), "-a", "-c", str(config), "-l", "-",
        f"INCDIR={checkout / 'scripts'}", f"HELPERDIR={checkout / 'helpers'}", f"RESULTFILE={status}",
        "MARK_OFFLINE=0", "DETACHED_MODE=0",
    ]  # fmt: skip


def environment_python() -> str:
    with contextlib.suppress(OSError):
        recorded = Path(RECORDED_PYTHON).read_text().strip()
        if recorded:
            return recorded
    return sys.executable  # where node-health finds it too, when no environment was recorded


def spin() -> None:
    while True:
        pass


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nhc", metavar="DIR", help="a checkout of LBNL NHC (git clone https://github.com/mej/nhc)")
    p.add_argument("--rounds", metavar="N", type=int, default=7, help="measured rounds (default %(default)s)")
    p.add_argument("--load", metavar="N", type=int, default=0, help="processes spinning on the CPU meanwhile")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    args = p.parse_args()
    checkout = Path(args.nhc).resolve() if args.nhc else None
    if checkout is not None and not (checkout / "nhc").is_file():
        raise common.BenchmarkError(f"--nhc {args.nhc}: no nhc script there (a checkout of github.com/mej/nhc)")
    python = environment_python()
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.load)]
    samples: dict[str, list[common.Timing]] = {}
    with tempfile.TemporaryDirectory(prefix="clustercheck-node-health-") as tmp:
        exe, cache = common.clustercheck_exe(), str(Path(tmp) / "cache")
        # The health program as slurmd runs it every interval (torch's import kept from the round before) and as
        # it runs after a change, on its first run, or once its kept import is older than --torch-max-age.
        sides = {
            "clustercheck": [exe, "node-health", "--cache-dir", cache],
            "clustercheck, importing torch": [exe, "node-health", "--cache-dir", cache, "--torch-max-age", "0"],
            "import torch": [python, "-c", "import torch"],
        }
        checks = []
        if checkout is not None:
            checks = nhc_config(Path(tmp) / "nhc.conf")
            sides["nhc"] = nhc_argv(checkout, Path(tmp) / "nhc.conf", Path(tmp) / "nhc.status")
        for spinner in spinners:
            spinner.start()
        try:
            for round_ in range(args.rounds + 1):  # round 0 warms up and is not counted
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    timing = common.timed(sides[side], cwd=tmp)
                    if side.startswith("clustercheck") and timing.returncode not in (0, 1):
                        raise common.BenchmarkError(f"node-health exited {timing.returncode}: {timing.stderr[-300:]}")
                    if round_:
                        samples.setdefault(side, []).append(timing)
                common.say(f"round {round_}: " + ", ".join(f"{s} {samples[s][-1].wall:.2f} s" for s in samples))
        finally:
            for spinner in spinners:
                spinner.kill()
    info = common.machine()
    figures = {
        side: {
            "wall_s": round(common.median([t.wall for t in timings]), 3),
            "cpu_s": round(common.median([t.cpu for t in timings]), 3),
            "max_wall_s": round(max(t.wall for t in timings), 3),
            "exit_codes": sorted({t.returncode for t in timings}),
        }
        for side, timings in samples.items()
    }
    print(f"node health on this machine, {args.rounds} rounds, load {args.load}: {common.describe(info)}")
    print("| program | wall s (median) | wall s (max) | CPU s | exit |")
    print("| --- | ---: | ---: | ---: | --- |")
    for side, f in figures.items():
        codes = ", ".join(map(str, f["exit_codes"]))
        print(f"| {side} | {f['wall_s']:.3f} | {f['max_wall_s']:.3f} | {f['cpu_s']:.3f} | {codes} |")
    if checkout is not None:
        print(f"NHC's checks ({len(checks)}): " + "; ".join(f"`{line}` ({what})" for line, what in checks))
    common.write_json(
        args.json,
        {
            "machine": info,
            "rounds": args.rounds,
            "load": args.load,
            "python": python,
            "figures": figures,
            "nhc_checks": [line for line, _ in checks],
            "samples": {side: [t.wall for t in timings] for side, timings in samples.items()},
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(common.run("node_health", main))
