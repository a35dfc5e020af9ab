#!/usr/bin/env python3
"""Preflight against Ansible's fact gathering: the core stage without the node-local torch job (`clustercheck run
--only core --skip 'local.*'`) against `ansible all -m setup`, on the same nodes (goal: clustercheck faster).

    benchmarks/preflight.py                    # the Docker test cluster: 3 nodes with torch, 16 nodes without
    benchmarks/preflight.py --hosts INVENTORY  # your own nodes (ansible reads the same inventory)

Both commands run as a user runs them, in interleaved rounds (clustercheck, then Ansible), and the figures are
medians over the rounds. Ansible runs cold in every round: a fresh ControlPath directory, so no SSH connection
of an earlier round is reused (clustercheck opens fresh connections every run too); its persistent connections
are closed after each round. The warm figure (Ansible again at once, reusing the connections its cold run left,
as a second run within ControlPersist's 60 s gets) is reported beside it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common

TORCH_NODES = 3
PLAIN_NODES = 16


def ansible_exe() -> str:
    beside = Path(sys.executable).parent / "ansible"
    found = str(beside) if beside.exists() else shutil.which("ansible")
    if not found:
        raise common.BenchmarkError("ansible is not installed (pip install ansible-core)")
    return found


def close_masters(control_dir: str) -> None:
    """Stop the SSH connection masters Ansible left in CONTROL_DIR (ControlPersist), so none outlives the round."""
    for socket in Path(control_dir).iterdir():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"], capture_output=True, timeout=10)


def measure(nodes: common.Nodes, names: list[str], rounds: int, label: str) -> dict:
    cpu = common.NodeCpu(nodes)
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_NOCOLOR": "1"}
    ansible = [ansible_exe(), "all", "-i", nodes.inventory, "--limit", ",".join(names), "-m", "setup"]
    samples: dict[str, list[common.Timing]] = {"clustercheck": [], "ansible": [], "ansible_warm": []}
    with tempfile.TemporaryDirectory(prefix="clustercheck-preflight-") as tmp:
        for round_ in range(rounds + 1):  # round 0 warms up and is not counted
            run_dir = Path(tmp) / f"run-{round_}"
            check = common.timed(common.core_stage(nodes, names, run_dir, "--skip", "local.*"), cpu=cpu, names=names)
            problem = common.reached_every_node(check, names)
            if problem:
                raise common.BenchmarkError(f"the core stage did not get through: {problem}")
            control = Path(tmp) / f"cp-{round_}"
            control.mkdir()
            round_env = {**env, "ANSIBLE_SSH_CONTROL_PATH_DIR": str(control)}
            try:
                cold = common.timed(ansible, cpu=cpu, names=names, env=round_env, cwd=common.REPO)
                warm = common.timed(ansible, cpu=cpu, names=names, env=round_env, cwd=common.REPO)
            finally:
                close_masters(str(control))
            for timing in (cold, warm):
                if timing.returncode != 0:
                    raise common.BenchmarkError(f"{' '.join(ansible)} failed: {(timing.stdout + timing.stderr)[-500:]}")
            head = "warm-up" if round_ == 0 else f"round {round_}/{rounds}"
            print(
                f"  {label} {head}: clustercheck {check.wall:.2f} s, ansible -m setup {cold.wall:.2f} s "
                f"(warm {warm.wall:.2f} s)",
                file=sys.stderr,
            )
            if round_:
                samples["clustercheck"].append(check)
                samples["ansible"].append(cold)
                samples["ansible_warm"].append(warm)
    figures = {}
    for what, timings in samples.items():
        entry = {
            "wall_s": [t.wall for t in timings],
            "median_wall_s": common.median([t.wall for t in timings]),
            "median_cpu_s": common.median([t.cpu for t in timings]),
        }
        node_cpus = [t.node_cpu for t in timings if t.node_cpu is not None]
        if node_cpus:
            entry["median_node_cpu_s"] = common.median(node_cpus)
        figures[what] = entry
    ratio = figures["clustercheck"]["median_wall_s"] / figures["ansible"]["median_wall_s"]
    return {"label": label, "nodes": len(names), "figures": figures, "ratio_clustercheck_to_ansible": ratio}


def report(result: dict) -> None:
    print(
        f"Preflight against Ansible's fact gathering, median of {result['rounds']} rounds; "
        f"{common.describe(result['machine'])} (at the start: {result['load_average_at_start'][0]:.2f})"
    )
    print(f"{'nodes':<28}  {'clustercheck s':>14}  {'ansible -m setup s':>18}  {'(warm) s':>8}  {'ratio':>5}  CPU s")
    for phase in result["phases"]:
        f = phase["figures"]
        print(
            f"{phase['label']:<28}  {f['clustercheck']['median_wall_s']:14.2f}  {f['ansible']['median_wall_s']:18.2f}  "
            f"{f['ansible_warm']['median_wall_s']:8.2f}  {phase['ratio_clustercheck_to_ansible']:5.2f}  "
            f"clustercheck {_cpu(f['clustercheck'])}, ansible {_cpu(f['ansible'])}"
        )
    print("ratio: clustercheck's wall time / ansible -m setup's (cold); below 1 is faster than Ansible")
    print("CPU s: the command's own + the nodes' (test cluster only), medians")


def _cpu(figures: dict) -> str:
    nodes = figures.get("median_node_cpu_s")
    return f"{figures['median_cpu_s']:.2f}" + ("" if nodes is None else f" + {nodes:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__.split("\n\n")[0], rounds=5, limit=True)
    args = parser.parse_args(argv)
    at_start = common.machine()
    phases = []
    if args.hosts:
        nodes = common.own_nodes(args.hosts, args.limit)
        label = f"{len(nodes.names)} node(s) of {Path(args.hosts).name}"
        phases.append(measure(nodes, nodes.names, args.rounds, label))
    else:
        # One cluster: torch on the first 3 nodes, the next 16 without it.
        with common.test_cluster(TORCH_NODES + PLAIN_NODES, "-preflight", reuse=args.reuse, keep=args.keep) as nodes:
            torch_nodes = nodes.names[:TORCH_NODES]
            common.install_torch(nodes, torch_nodes)
            phases.append(measure(nodes, torch_nodes, args.rounds, f"{TORCH_NODES} nodes with torch"))
            plain = nodes.names[TORCH_NODES:]
            phases.append(measure(nodes, plain, args.rounds, f"{PLAIN_NODES} nodes without torch"))
    result = {
        "benchmark": "preflight",
        "rounds": args.rounds,
        "machine": common.machine(),
        "load_average_at_start": at_start["load_average"],
        "hosts": args.hosts or "test cluster",
        "phases": phases,
    }
    report(result)
    common.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(common.run("preflight", main))
