"""Setup idempotence: `ansible-playbook site.yml` on fresh nodes, then again (--rounds times) on the same nodes.

Every second run must report changed=0 on every node; the figure is the ratio of the second run's wall time
(median over the repeats) to the first's, goal 0.3 or less. Ansible's own junit callback records every task's
time on every host, so the slowest tasks of the second run are printed beside the ratio: where an idempotent
run still spends its time.

By default on three fresh Ubuntu test nodes (20.04, 22.04, 24.04, reached as the sudo user `ops`, packages through
the control machine's apt-cacher-ng), with the test suite's variables and wheelhouse (tests/conftest.py's
ansible_playbook, as tests/ansible/test_ubuntu_nodes.py runs it); `--os debian12` uses three Debian 12 nodes
instead. With --hosts INVENTORY: `ansible-playbook -i INVENTORY site.yml` on your own nodes as they are (so the
"first" run there is only a first run on fresh nodes).

With --against NAME, each round also runs site.yml once the other way, before the checkout's way in every other
round (the run straight after the first is the slowest either way), and prints both medians: `linear` is Ansible's
own strategy (ANSIBLE_STRATEGY=linear, SSH pipelining on as ansible.cfg says; the checkout runs Mitogen's),
`linear-unpiped` the same with SSH pipelining off (ANSIBLE_PIPELINING=False). Set in the environment, ANSIBLE_STRATEGY
and ANSIBLE_PIPELINING change the checkout's way too (ANSIBLE_STRATEGY=linear with --against linear-unpiped measures
pipelining alone).

    .venv/bin/python benchmarks/setup_idempotence.py [--os ubuntu|debian12] [--rounds N] [--against NAME] [--json FILE]
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

import common
from common import REPO, BenchmarkError, say

sys.path.insert(0, str(REPO / "tests" / "ansible"))

UBUNTU = ["ubuntu20.04", "ubuntu22.04", "ubuntu24.04"]
# --against: the other way to run site.yml, as environment variables over the checkout's ansible.cfg
AGAINST = {
    "linear": {"ANSIBLE_STRATEGY": "linear"},
    "linear-unpiped": {"ANSIBLE_STRATEGY": "linear", "ANSIBLE_PIPELINING": "False"},
}


def task_times(junit_dir: Path) -> dict[str, float]:
    """Each task's wall time over all hosts (the slowest host's), from Ansible's junit callback output:
    "role : task" -> seconds."""
    per_task: dict[str, float] = defaultdict(float)
    for path in junit_dir.glob("*.xml"):
        for case in ET.parse(path).iter("testcase"):
            name = case.get("name", "")
            task = name.split("] ", 1)[-1]  # "[host] play: task"
            task = task.split(": ", 1)[-1] if ": " in task else task
            per_task[task] = max(per_task[task], float(case.get("time") or 0))
    return dict(per_task)


def playbook(run, label: str, workdir: Path) -> dict:
    """One run of site.yml through RUN(env) -> CompletedProcess; its time, recap and per-task times."""
    from test_site_playbook import changed_tasks, recap

    junit = workdir / label
    junit.mkdir()
    env = {"ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.junit", "JUNIT_OUTPUT_DIR": str(junit)}
    say(f"site.yml: {label} run ...")
    started = time.monotonic()
    proc = run(env)
    seconds = time.monotonic() - started
    counts = recap(proc.stdout)
    if proc.returncode != 0 or not counts:
        raise BenchmarkError(f"the {label} run of site.yml failed (exit {proc.returncode}): {proc.stdout[-3000:]}")
    say(f"site.yml: {label} run took {seconds:.1f} s, changed={sum(c['changed'] for c in counts.values())}")
    return {
        "seconds": round(seconds, 2),
        "recap": counts,
        "changed_tasks": changed_tasks(proc.stdout),
        "tasks": task_times(junit),
    }


@contextlib.contextmanager
def environment(extra: dict):
    """EXTRA set in this process's environment for the duration (conftest's ansible_playbook passes it on)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(args, run_site) -> dict:
    with tempfile.TemporaryDirectory(prefix="setup-bench-") as tmp:
        first = playbook(run_site, "first", Path(tmp))
        seconds, other = [], []

        def run_other(env: dict) -> subprocess.CompletedProcess:
            return run_site({**env, **AGAINST[args.against]})

        for i in range(args.rounds):
            if args.against and i % 2:  # every other round the other order: the run after the first is slower
                other.append(playbook(run_other, f"second-{i + 1}-{args.against}", Path(tmp)))
            seconds.append(playbook(run_site, f"second-{i + 1}", Path(tmp)))
            if args.against and not i % 2:
                other.append(playbook(run_other, f"second-{i + 1}-{args.against}", Path(tmp)))
    return {"first": first, "second": seconds, "against": args.against, "second_against": other}


def report(doc: dict) -> None:
    first, seconds = doc["first"], doc["second"]
    med = common.median([s["seconds"] for s in seconds])
    ratio = med / first["seconds"]
    changed = [sum(c["changed"] for c in s["recap"].values()) for s in seconds]
    doc["ratio"] = round(ratio, 3)
    doc["second_median_seconds"] = round(med, 2)
    doc["second_changed"] = changed
    print(f"machine: {common.describe(doc['machine'])}")
    print(f"nodes: {doc['nodes']}")
    print(f"first run: {first['seconds']:.1f} s  (changed per node: {[c['changed'] for c in first['recap'].values()]})")
    for i, s in enumerate(seconds, 1):
        print(f"second run {i}: {s['seconds']:.1f} s  changed={changed[i - 1]}")
        for line in s["changed_tasks"]:
            print(f"    changed: {line}")
    if doc["second_against"]:
        other = [s["seconds"] for s in doc["second_against"]]
        off = common.median(other)
        doc["second_median_seconds_against"] = round(off, 2)
        print(f"second run {doc['against']}: {', '.join(f'{x:.1f}' for x in other)} s")
        print(f"second run: median {med:.1f} s against {off:.1f} s {doc['against']} ({med / off:.2f})")
        changed = changed + [sum(c["changed"] for c in s["recap"].values()) for s in doc["second_against"]]
    verdict = "meets" if ratio <= 0.3 and not any(changed) else "misses"
    print(f"ratio second/first: {ratio:.3f} (median of {len(seconds)}; goal 0.3 or less, changed=0): {verdict} it")
    slow = sorted(seconds[0]["tasks"].items(), key=lambda kv: -kv[1])[:15]
    print("slowest tasks of the second run (seconds, slowest host):")
    for name, secs in slow:
        print(f"  {secs:7.2f}  {name}")
    doc["second_slowest_tasks"] = [[n, round(s, 2)] for n, s in slow]


def main() -> int:
    p = common.parser(__doc__.split("\n\n")[0], rounds=3)
    p.add_argument("--os", choices=["ubuntu", "debian12"], default="ubuntu", help="the test nodes' OS (default ubuntu)")
    p.add_argument("--against", choices=sorted(AGAINST), help="each round also run this other way, alternating")
    args = p.parse_args()
    doc = {"benchmark": "setup_idempotence", "machine": common.machine()}
    if args.hosts:
        ansible = str(Path(sys.executable).parent / "ansible-playbook")

        def run_site(env: dict) -> subprocess.CompletedProcess:
            cmd = [ansible, "-i", args.hosts, str(REPO / "site.yml")]
            full = {**os.environ, "ANSIBLE_STDOUT_CALLBACK": "default", "ANSIBLE_NOCOLOR": "1", **env}
            return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=full)

        doc["nodes"] = args.hosts
        doc.update(measure(args, run_site))
    else:
        import conftest

        os_name = UBUNTU if args.os == "ubuntu" else "debian12"
        user = conftest.UBUNTU_USER if args.os == "ubuntu" else "root"
        wheels = common.wheelhouse()
        # Fresh nodes every time: the first run is the one on fresh nodes (--reuse does not apply).
        with common.test_cluster(3, "-setup", reuse=False, keep=args.keep, os_name=os_name, user=user) as nodes:
            cluster = nodes.cluster

            def run_site(env: dict) -> subprocess.CompletedProcess:
                with environment(env):
                    return conftest.ansible_playbook(cluster, wheels)

            doc["nodes"] = f"3 test nodes: {', '.join(n.os for n in cluster.nodes)} (user {cluster.user})"
            doc.update(measure(args, run_site))
    doc["machine_after"] = common.machine()
    report(doc)
    common.write_json(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(common.run("setup_idempotence", main))
