"""site.yml on the 3-node test cluster: converge, idempotence, check mode, then the acceptance suite.

The converge itself is the session fixture `converged_cluster` (tests/conftest.py), shared with the other tests
that need nodes as site.yml leaves them (tests/ansible, the fault suite).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import REPO, ansible_playbook

pytestmark = pytest.mark.cluster

RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines: host -> counts."""
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in RECAP.finditer(output.split("PLAY RECAP", 1)[-1])
    }


def changed_tasks(output: str) -> list[str]:
    """The names of tasks that reported a change (to say what broke idempotence)."""
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line
        elif line.startswith("changed:"):
            found.append(f"{task} {line}")
    return found


def test_recap_parser():
    out = "PLAY RECAP ****\nnode1  : ok=3    changed=1    unreachable=0    failed=0    skipped=2\n"
    assert recap(out) == {"node1": {"ok": 3, "changed": 1, "unreachable": 0, "failed": 0}}


def converged(cluster) -> dict[str, dict[str, int]]:
    """The contract of a first site.yml run: every node of CLUSTER converged, none failed or unreachable."""
    counts = recap(cluster.converge_output)
    assert set(counts) == {n.name for n in cluster.nodes}
    assert all(c["failed"] == 0 and c["unreachable"] == 0 for c in counts.values()), counts
    print(f"converge: {cluster.converge_seconds:.0f}s")
    return counts


def changes_nothing(cluster, wheelhouse, *args: str) -> None:
    """The contract of a second site.yml run (or one in --check mode): no failure and no change on any node;
    a change is reported with the task that made it."""
    started = time.monotonic()
    proc = ansible_playbook(cluster, wheelhouse, *args)
    print(f"site.yml {' '.join(args) or 'again'}: {time.monotonic() - started:.0f}s")
    assert proc.returncode == 0, proc.stdout[-4000:]
    counts = recap(proc.stdout)
    assert counts and all(c["failed"] == 0 and c["changed"] == 0 for c in counts.values()), "\n".join(
        changed_tasks(proc.stdout)
    )


def test_converge_succeeds_on_every_node(converged_cluster):
    converged(converged_cluster)


def test_second_run_changes_nothing(converged_cluster, wheelhouse):
    changes_nothing(converged_cluster, wheelhouse)


def test_check_mode_runs_clean(converged_cluster, wheelhouse):
    changes_nothing(converged_cluster, wheelhouse, "--check")


def acceptance(cluster, *args: str) -> subprocess.CompletedProcess:
    """The acceptance suite, as a user runs it against their inventory."""
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--timeout=600"]  # in lanes, as users run it
    cmd += [*(args or [str(REPO / "tests" / "acceptance")]), "--hosts=ansible://gpu_nodes"]
    cmd += [f"--ansible-inventory={cluster.inventory}"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env
    )  # testinfra runs ansible-*


def inventory_with(cluster, directory: Path, settings: dict) -> SimpleNamespace:
    """CLUSTER's inventory copied into DIRECTORY with SETTINGS in group_vars/all.yml (and its host_vars), as a user's
    inventory holds what the test variables pass on the command line: for the acceptance suite, which reads them."""
    inventory = directory / "hosts.ini"
    inventory.write_text(Path(cluster.inventory).read_text())
    (directory / "group_vars").mkdir()
    (directory / "group_vars" / "all.yml").write_text(yaml.safe_dump(settings))
    for host_vars in (Path(cluster.inventory).parent / "host_vars").glob("*.yml"):
        (directory / "host_vars").mkdir(exist_ok=True)
        (directory / "host_vars" / host_vars.name).write_text(host_vars.read_text())
    return SimpleNamespace(inventory=str(inventory))


def test_acceptance_suite_passes(converged_cluster):
    proc = acceptance(converged_cluster)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout)[1])
    assert passed >= 10 * len(converged_cluster.nodes), proc.stdout[-2000:]


def test_the_acceptance_suite_starts_the_registered_jupyter_kernel(converged_cluster, tmp_path):
    """testcluster-vars.yml has the role register the environment as a Jupyter kernel. With the setting in the
    inventory, where a user keeps it, the acceptance suite starts that kernel on every node by its name, and the
    kernel runs the environment's python and torch."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    shutil.copy(converged_cluster.inventory, inventory / "hosts.ini")
    (inventory / "group_vars" / "all.yml").write_text("python_env_jupyter_kernel: true\n")
    test = REPO / "tests" / "acceptance" / "test_python_env.py"
    proc = acceptance(
        SimpleNamespace(inventory=str(inventory)), f"{test}::test_the_jupyter_kernel_runs_the_environments_python"
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert f"{len(converged_cluster.nodes)} passed" in proc.stdout, proc.stdout[-2000:]


def test_the_acceptance_suite_checks_docker_where_the_containers_role_ran(converged_cluster, tmp_path):
    """containers_enabled (testcluster-vars.yml) put Docker on the nodes, masked since they can run no daemon, with
    its networks off the cluster network; the toolkit test skips (no GPU on these nodes)."""
    proc = acceptance(
        inventory_with(converged_cluster, tmp_path, {"containers_enabled": True}),
        str(REPO / "tests" / "acceptance" / "test_containers.py"),
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert re.search(r"\b6 passed, 3 skipped\b", proc.stdout), proc.stdout[-3000:]


def test_acceptance_suite_fails_on_a_broken_node_and_the_role_repairs_it(converged_cluster, wheelhouse):
    """Map node2's own name to 127.0.1.1 (the Debian default that makes gloo bind to loopback): the
    suite must fail on node2 only; a cluster_hosts run repairs it."""
    node = converged_cluster.node("node2")
    hosts_test = str(REPO / "tests" / "acceptance" / "test_hosts.py")
    subprocess.run(["docker", "exec", node.container, "sh", "-c", "echo '127.0.1.1 node2' >> /etc/hosts"], check=True)
    try:
        broken = acceptance(converged_cluster, hosts_test)
        assert broken.returncode == 1, broken.stdout[-3000:]
        failed = re.findall(r"^FAILED (\S+)", broken.stdout, re.M)
        assert failed and all("node2" in f for f in failed), broken.stdout[-3000:]
    finally:
        repair = ansible_playbook(converged_cluster, wheelhouse, "--tags", "cluster_hosts", "--limit", "node2")
    assert repair.returncode == 0, repair.stdout[-3000:]
    assert recap(repair.stdout)["node2"]["changed"] >= 1
    assert acceptance(converged_cluster, hosts_test).returncode == 0


def test_conda_path_renders_in_check_mode(converged_cluster, wheelhouse, tmp_path):
    """conda's installer cannot be downloaded here: the conda path runs in check mode only (its
    templates render, the checksum table has the installer, nothing touches the network)."""
    installer = tmp_path / "Miniforge3-24.11.3-0-Linux-x86_64.sh"
    installer.write_text("#!/bin/sh\n# stand-in: never run (check mode)\n")
    proc = ansible_playbook(
        converged_cluster,
        wheelhouse,
        "--check",
        "--diff",
        "--tags",
        "python_env",
        "--limit",
        "node1",
        "-e",
        "python_env_manager=conda",
        "-e",
        f"python_env_conda_installer_local={installer}",
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "Python env | PATCH | Run the installer into the shared prefix" in proc.stdout
    assert "- torch==2.13.0" in proc.stdout  # the environment.yml's pip section, in the diff


def test_clustercheck_proves_the_nodes_site_yml_set_up(converged_cluster, tmp_path):
    """The product end to end: one inventory drives the setup and the verification. On the nodes
    site.yml converged, clustercheck finds the environment the python_env role recorded and every
    stage passes: core checks, network, collectives and DDP equivalence across the three nodes."""
    empty_ssh_config = tmp_path / "ssh_config"
    empty_ssh_config.touch()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "clustercheck"),
            "run",
            "--hosts",
            converged_cluster.inventory,
            "--ssh-config",
            str(empty_ssh_config),
            "--run-dir",
            str(tmp_path / "run"),
            "--format",
            "json",
            "--master-port",
            "29661",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    checks = {(c["name"], c["host"]): c for c in json.loads(proc.stdout)["checks"]}
    for node in converged_cluster.nodes:
        python_env = checks[("python.env", node.name)]
        assert python_env["status"] == "PASS"
        assert python_env["data"]["source"] == "/etc/clustercheck/python"
        assert checks[("firewall", node.name)]["status"] == "PASS"
        assert checks[("time.sync", node.name)]["status"] == "PASS"
        assert checks[("hostname.resolve", node.name)]["status"] == "PASS"
    ddp = checks[("ddp_equivalence", None)]
    assert ddp["status"] == "PASS"
    assert ddp["data"]["world_size"] == 2 * len(converged_cluster.nodes)
