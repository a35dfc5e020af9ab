"""The slurm role on the converged Debian test cluster (slurm_enabled in testcluster-vars.yml; Slurm 22.05 from
Debian's packages, real munge, slurmctld and slurmd):
every node idle, srun on all three, the acceptance suite's Slurm tests, and the health program (clustercheck
node-health --slurm) draining a node a per-node check FAILs on, resuming it when fixed, and leaving alone a node an
administrator drained. Converge, second run and check mode are test_site_playbook.py's."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, ansible_playbook
from harness import leftovers
from test_site_playbook import acceptance, changed_tasks, recap

pytestmark = pytest.mark.cluster

INTERVAL = 10  # HealthCheckInterval while the health program is under test (the role's default is 300)


def on(node, command: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["docker", "exec", node.container, "sh", "-c", command], capture_output=True, text=True, timeout=180
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{node.name}: {command}: exit {proc.returncode}: {proc.stdout}{proc.stderr}")
    return proc


def states(controller) -> dict[str, tuple[str, str]]:
    """sinfo's view: node -> (state, reason)."""
    out = on(controller, "sinfo --noheader --Node --format='%N|%T|%E'").stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines() if line.strip())}


def wait_for(controller, wanted, seconds: float, what: str) -> dict:
    """sinfo's states once WANTED(states) holds; fails with the last states after SECONDS."""
    deadline = time.monotonic() + seconds
    while True:
        seen = states(controller)
        if wanted(seen):
            return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {seconds:.0f} s; sinfo: {seen}")
        time.sleep(2)


def all_idle(seen: dict) -> bool:
    return len(seen) == 3 and all(state == "idle" for state, _ in seen.values())


@pytest.fixture(scope="module")
def slurm_cluster(converged_cluster):
    """The converged cluster with every node idle in Slurm: a node an earlier test's fault drained is resumed by its
    own health program first (it drains and resumes only with its own reason)."""
    for node in converged_cluster.nodes:
        on(node, "/usr/local/sbin/clustercheck-slurm-health", check=False)
    wait_for(converged_cluster.nodes[0], all_idle, 60, "every node idle")
    return converged_cluster


def test_every_node_is_idle_and_srun_runs_on_all_three(slurm_cluster):
    controller = slurm_cluster.nodes[0]
    out = on(controller, "timeout 120 srun --nodes=3 --ntasks-per-node=1 hostname -s").stdout
    assert sorted(out.split()) == ["node1", "node2", "node3"]
    shown = on(controller, "scontrol show node node2").stdout
    assert "CPUTot=" in shown and "Partitions=gpu" in shown


def test_the_acceptance_suite_checks_slurm(slurm_cluster, tmp_path):
    """The acceptance suite's Slurm tests, with slurm_enabled in the inventory as a user's cluster has it."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(Path(slurm_cluster.inventory).read_text())
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text(yaml.safe_dump({"slurm_enabled": True}))
    for host_vars in (Path(slurm_cluster.inventory).parent / "host_vars").glob("*.yml"):
        (tmp_path / "host_vars").mkdir(exist_ok=True)
        (tmp_path / "host_vars" / host_vars.name).write_text(host_vars.read_text())
    proc = acceptance(SimpleNamespace(inventory=str(inventory)), str(REPO / "tests" / "acceptance" / "test_slurm.py"))
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout)[1])
    assert passed == 5 * 3 + 2, proc.stdout[-3000:]  # five tests on each node, two over all nodes


def test_clustercheck_runs_every_stage_through_srun_from_the_controller(slurm_cluster):
    """`salloc --nodes=3 clustercheck run --slurm` on the controller (the login node), with the clustercheck the role
    installed there: every stage reaches the nodes as job steps of the allocation, no SSH; DDP equivalence passes,
    and nothing is left in squeue or on the nodes."""
    controller = slurm_cluster.nodes[0]
    proc = on(
        controller,
        "cd /root && timeout 900 salloc --nodes=3 clustercheck run --slurm --format json --run-dir /root/srun-run "
        "--master-port 29581 > /root/srun-report.json",
        check=False,
    )
    report = json.loads(on(controller, "cat /root/srun-report.json").stdout)
    results = {(r["host"] or "", r["name"]): r for r in report["checks"]}
    failed = {key: r["message"] for key, r in results.items() if r["status"] in ("FAIL", "ERROR")}
    assert proc.returncode == 0 and not failed, f"exit {proc.returncode}: {failed}\n{proc.stderr[-3000:]}"
    assert sorted(report["hosts"]) == ["node1", "node2", "node3"]
    for node in ("node1", "node2", "node3"):
        assert "srun, a step of Slurm job" in results[(node, "connect")]["message"], results[(node, "connect")]
    assert results[("", "ddp_equivalence")]["status"] == "PASS"
    assert on(controller, "squeue --noheader").stdout.strip() == ""
    assert leftovers(slurm_cluster) == {}


def test_clustercheck_asks_slurm_for_the_nodes_and_gives_them_back(slurm_cluster):
    """Outside an allocation, `--slurm --nodes=3` makes one (salloc --no-shell), runs there and cancels it; an
    allocation Slurm cannot grant is one line and exit 5."""
    controller = slurm_cluster.nodes[0]
    proc = on(
        controller,
        "cd /root && clustercheck run --slurm --nodes=3 --only core --format json --run-dir /root/srun-alloc "
        "> /root/srun-alloc.json",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(on(controller, "cat /root/srun-alloc.json").stdout)
    assert sorted(report["hosts"]) == ["node1", "node2", "node3"]
    assert on(controller, "squeue --noheader").stdout.strip() == ""  # given back
    refused = on(controller, "clustercheck run --slurm --nodes=4 --slurm-wait=5", check=False)
    assert refused.returncode == 5, refused.stderr
    assert refused.stderr.startswith("clustercheck: error: --slurm: Slurm granted no allocation (")
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr


def test_a_failing_check_drains_the_node_fixing_it_resumes_it_and_an_admins_drain_stays(slurm_cluster, wheelhouse):
    controller, node2, node3 = slurm_cluster.nodes
    key_before = on(controller, "sha256sum /etc/munge/munge.key").stdout.split()[0]
    # node3 gets a munge key of its own (as a reinstalled node has): the role gives it the cluster's again, unseen.
    on(node3, "dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none && systemctl restart munge")
    proc = ansible_playbook(
        slurm_cluster, wheelhouse, "--tags", "slurm", "--diff", "-v", "-e", f"slurm_health_check_interval={INTERVAL}"
    )
    try:
        assert proc.returncode == 0, proc.stdout[-4000:]
        changed = changed_tasks(proc.stdout)
        assert any("Reconfigure Slurm" in task for task in changed), changed  # a new interval is a reconfigure ...
        assert not any("Restart Slurm" in task for task in changed), changed  # ... not a restart
        assert any("munge key" in task and "node3" in task for task in changed), changed
        assert set(recap(proc.stdout)) == {"node1", "node2", "node3"}
        key = on(controller, "base64 -w0 /etc/munge/munge.key").stdout.strip()
        raw = base64.b64decode(key)
        for shown in (key, key[:24], raw.hex()[:32]):
            assert shown not in proc.stdout + proc.stderr, "the munge key appears in Ansible's output"
        for node in slurm_cluster.nodes:
            assert on(node, "sha256sum /etc/munge/munge.key").stdout.split()[0] == key_before

        on(node2, "systemctl stop chrony")  # a per-node check FAILs: time.sync
        seen = wait_for(
            controller, lambda s: "drain" in s["node2"][0], 3 * INTERVAL + 30, "node2 drained by its health program"
        )
        assert seen["node2"][1].startswith("clustercheck: time.sync: "), seen["node2"]
        assert seen["node1"][0] == seen["node3"][0] == "idle", seen

        on(node2, "systemctl start chrony")
        wait_for(controller, lambda s: s["node2"][0] == "idle", 3 * INTERVAL + 60, "node2 resumed once chrony runs")

        on(controller, "scontrol update nodename=node3 state=drain reason='disk swap'")
        time.sleep(3 * INTERVAL)  # three health runs on a healthy node3
        seen = states(controller)
        assert "drain" in seen["node3"][0] and seen["node3"][1] == "disk swap", seen
    finally:
        on(node2, "systemctl start chrony", check=False)
        on(controller, "scontrol update nodename=node3 state=resume", check=False)
        restored = ansible_playbook(slurm_cluster, wheelhouse, "--tags", "slurm")
        assert restored.returncode == 0, restored.stdout[-3000:]
    wait_for(controller, all_idle, 60, "every node idle again")
