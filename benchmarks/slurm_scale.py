#!/usr/bin/env python3
"""clustercheck through Slurm against over SSH on N Slurm test nodes (default 64): brings up N Debian 12 test
nodes, sets them up with site.yml (the roles base, cluster_hosts, python_env, slurm and ssh_trust: Slurm 22.05 from
Debian's packages, node1 its controller and the login node), then runs benchmarks/srun_vs_ssh.py on node1 inside an
allocation of every node: the core stage and the network stage, through job steps and over SSH, alternating.

    benchmarks/slurm_scale.py                      # 64 nodes, brought up and taken down
    benchmarks/slurm_scale.py --nodes 8 --keep --json slurm-8.json

One machine holds every node, so the nodes get no torch (about 1 GB per node, and a torch process per rank on
every node of the whole run): their environment is a venv of the system Python, the torch checks and the node-local
collectives are left out on both sides, and the torch stages (collectives, DDP) are not measured here
(srun_vs_ssh.py --all measures them on the 3-node Slurm test cluster). The setup's wall time is recorded beside the
figures.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path

import common

ROLES = "base,cluster_hosts,python_env,slurm,ssh_trust"
SKIPPED = ["torch.*", "local.*"]  # no torch on these nodes


def on(container: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["docker", "exec", container, "sh", "-c", command], capture_output=True, text=True, timeout=timeout
    )


def set_up(nodes: common.Nodes, forks: int) -> float:
    """site.yml's Slurm roles on the test nodes, with a torch-less environment; its wall time."""
    import conftest

    wheelhouse = common.wheelhouse()
    no_torch = {
        "python_env_torch_version": "",
        "python_env_packages": ["mpmath==1.3.0"],
        "python_env_wheelhouse": str(conftest.pure_wheelhouse(wheelhouse)),
    }
    started = time.monotonic()
    proc = conftest.ansible_playbook(
        nodes.cluster, wheelhouse, "--tags", ROLES, "-e", json.dumps(no_torch), "--forks", str(forks), timeout=5400
    )
    if proc.returncode != 0:
        raise common.BenchmarkError(f"site.yml failed (exit {proc.returncode}): {proc.stdout[-3000:]}")
    return time.monotonic() - started


def wait_idle(controller: str, size: int, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    seen = ""
    while time.monotonic() < deadline:
        seen = on(controller, "sinfo --noheader --Node --format='%N %T'").stdout
        if sum(line.split()[1] == "idle" for line in seen.splitlines() if len(line.split()) == 2) == size:
            return
        time.sleep(5)
    raise common.BenchmarkError(f"not every node idle in Slurm after {seconds:.0f} s: {' '.join(seen.split())[:600]}")


def main() -> int:
    p = common.parser(__doc__.split("\n\n")[0], 3)
    p.add_argument("--nodes", type=int, default=64, help="test nodes (default %(default)s)")
    p.add_argument("--forks", type=int, default=16, help="Ansible's forks for the setup (default %(default)s)")
    args = p.parse_args()
    if args.hosts:
        raise common.BenchmarkError("on your own Slurm cluster run benchmarks/srun_vs_ssh.py on the login node")
    results = {"machine": common.machine(), "nodes": args.nodes, "rounds": args.rounds}
    with common.test_cluster(args.nodes, "-slurmscale", reuse=args.reuse, keep=args.keep) as nodes:
        common.raise_limits()
        controller = nodes.containers["node1"]
        if args.reuse and on(controller, "command -v clustercheck srun").returncode == 0:
            common.say("benchmark: the nodes are set up already")
        else:
            common.say(f"benchmark: setting up Slurm on {args.nodes} nodes ({ROLES})")
            results["setup_seconds"] = round(set_up(nodes, args.forks), 1)
            common.say(f"benchmark: set up in {results['setup_seconds']} s")
        wait_idle(controller, args.nodes)
        script = Path(__file__).with_name("srun_vs_ssh.py")
        subprocess.run(["docker", "cp", str(script), f"{controller}:/root/srun_vs_ssh.py"], check=True)
        names = "\n".join(nodes.names) + "\n"
        on(controller, f"printf %s {shlex.quote(names)} > /root/nodes.ini")
        skips = " ".join(f"--skip {shlex.quote(glob)}" for glob in SKIPPED)
        command = (
            f"cd /root && salloc --nodes={args.nodes} python3 /root/srun_vs_ssh.py --hosts /root/nodes.ini "
            f"--rounds {args.rounds} --network {skips} --json /root/srun-vs-ssh.json"
        )
        common.say(f"benchmark: on node1: {command}")
        started = time.monotonic()
        proc = on(controller, command, timeout=7200)
        results["benchmark_seconds"] = round(time.monotonic() - started, 1)
        if proc.returncode != 0:
            raise common.BenchmarkError(f"srun_vs_ssh.py exited {proc.returncode}: {proc.stderr[-2000:]}")
        print(proc.stdout, end="")
        results.update(json.loads(on(controller, "cat /root/srun-vs-ssh.json").stdout))
        results["machine_after"] = common.machine()
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(common.run("slurm_scale", main))
