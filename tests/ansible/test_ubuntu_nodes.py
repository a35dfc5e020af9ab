"""site.yml on real Ubuntu nodes: one of each release (node1: 20.04, node2: 22.04, node3: 24.04), Ansible
connecting as the non-root user `ops` with become, as the example inventory does.

Converge, idempotence, check mode and the acceptance suite; then the failures users met on Ubuntu,
each reproduced on these nodes: chrony 3.5 on 20.04, the firewall guard under become, a wheelhouse
for another Python, a torchvision that does not import beside torch, cloud-init rewriting /etc/hosts.
Tests that change a node put it back, so the order of this file is the order they run in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest
from conftest import REPO, UBUNTU_USER, ansible_playbook, own_cluster
from test_site_playbook import acceptance, changes_nothing, converged, recap

pytestmark = pytest.mark.cluster


def on_node(node, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """A command on NODE as root through docker exec: a look behind Ansible's back, or a deliberate break."""
    cmd = ["docker", "exec", node.container, "sh", "-c", command]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=600)


def test_converge_succeeds_on_every_ubuntu_release(converged_ubuntu_cluster):
    converged(converged_ubuntu_cluster)
    releases = {
        n.name: on_node(n, ". /etc/os-release && echo $VERSION_ID").stdout.strip()
        for n in converged_ubuntu_cluster.nodes
    }
    assert releases == {"node1": "20.04", "node2": "22.04", "node3": "24.04"}


def test_second_run_changes_nothing_on_ubuntu(converged_ubuntu_cluster, wheelhouse):
    changes_nothing(converged_ubuntu_cluster, wheelhouse)


def test_check_mode_runs_clean_on_ubuntu(converged_ubuntu_cluster, wheelhouse):
    changes_nothing(converged_ubuntu_cluster, wheelhouse, "--check")


def test_acceptance_suite_passes_on_ubuntu(converged_ubuntu_cluster):
    proc = acceptance(converged_ubuntu_cluster)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", proc.stdout)[1])
    assert passed >= 10 * len(converged_ubuntu_cluster.nodes), proc.stdout[-2000:]


def test_torch_runs_in_the_python311_venv_on_ubuntu_22_04(converged_ubuntu_cluster):
    """python_env_venv_python: python3.11 (Ubuntu 22.04's universe) gives a venv where the cp311 torch runs."""
    node = converged_ubuntu_cluster.node("node2")
    python = on_node(node, "cat /etc/clustercheck/python").stdout.strip()
    probe = "import sys, torch; print(sys.version_info[:2], torch.__version__, torch.ones(2).sum().item())"
    out = on_node(node, f"{python} -c '{probe}'")
    assert out.stdout.split() == ["(3,", "11)", "2.13.0+cpu", "2.0"], out.stdout


def test_slurm_23_11_on_the_ubuntu_24_04_node_drains_it_for_its_missing_torch(converged_ubuntu_cluster):
    """slurm_enabled only where the release is 24.04 (testcluster-vars.yml): node3 is a one-node Slurm 23.11 cluster,
    its own controller, in a play whose other hosts have no Slurm. Its environment has no torch (no wheel for
    Python 3.12 here), so the health program (clustercheck from its own Python 3.12 environment; slurmd runs it only
    at an interval, 0 in the tests) drains it for that; resumed by hand, it runs a job. The other releases have no
    Slurm."""
    node1, node2, node3 = converged_ubuntu_cluster.nodes
    assert "23.11" in on_node(node3, "slurmd -V").stdout
    assert "3.12" in on_node(node3, "/opt/clustercheck/tool/bin/python -V").stdout
    on_node(node3, "/usr/local/sbin/clustercheck-slurm-health")
    shown = on_node(node3, "sinfo --noheader --Node --format='%N|%T|%E'").stdout.strip()
    name, state, reason = shown.split("|", 2)
    assert name == "node3" and state == "drained" and reason.startswith("clustercheck: torch.import: "), shown
    on_node(node3, "scontrol update nodename=node3 state=resume")
    try:
        assert on_node(node3, "timeout 60 srun --nodes=1 hostname -s").stdout.strip() == "node3"
    finally:
        on_node(node3, "/usr/local/sbin/clustercheck-slurm-health")  # drained again, as it was
    assert on_node(node3, "sinfo --noheader --Node --format=%T").stdout.strip() == "drained"
    for other in (node1, node2):
        assert on_node(other, "command -v slurmd", check=False).returncode != 0, other.name


def test_chrony_config_fits_each_release(converged_ubuntu_cluster):
    """Failure 1: chrony 3.5 (20.04) rejected the generated configuration ('ntsdumpdir' is 4.0+). Every
    release's chronyd now parses it; 22.04 and 24.04 keep Ubuntu's confdir/sourcedir lines."""
    for node in converged_ubuntu_cluster.nodes:
        conf = on_node(node, "grep -v '^#' /etc/chrony/chrony.conf").stdout  # the directives, not the comments
        version = on_node(node, "chronyd -v").stdout.split()[3]
        modern = not version.startswith("3.")
        assert ("sourcedir /etc/chrony/sources.d" in conf) is modern, (node.name, version, conf)
        assert ("sourcedir /run/chrony-dhcp" in conf) is modern
        assert ("confdir /etc/chrony/conf.d" in conf) is modern
        assert ("ntsdumpdir" in conf) is modern
        assert on_node(node, "systemctl is-active chrony").stdout.strip() == "active", node.name
    assert converged_ubuntu_cluster.node("node1").os == "ubuntu20.04"


def test_a_wheelhouse_for_another_python_fails_with_what_to_build(converged_ubuntu_cluster, wheelhouse):
    """Failure 4: torch's cp311 wheels on Ubuntu 24.04 (Python 3.12) failed deep in pip ("No matching
    distribution"). The role now stops first, saying which Python the node has, what the wheels are for,
    and the pip download line that builds the right wheelhouse; on 20.04 (3.8) that torch needs 3.10."""
    proc = ansible_playbook(
        converged_ubuntu_cluster,
        wheelhouse,
        "--tags",
        "python_env",
        "--limit",
        "node1,node3",
        "-e",
        "python_env_torch_version=2.13.0",
        "-e",
        f"python_env_wheelhouse={wheelhouse}",
    )
    assert proc.returncode != 0
    assert recap(proc.stdout)["node3"]["failed"] == 1
    assert (
        "node3 has Python 3.12 on x86_64, but the wheelhouse's torch==2.13.0 wheels are for "
        "cp311-cp311-manylinux_2_28_x86_64; build a wheelhouse for it with: pip download -d wheelhouse "
        "--only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 torch==2.13.0"
    ) in proc.stdout, proc.stdout[-3000:]
    assert "No matching distribution" not in proc.stdout
    assert "node1 builds the environment with Python 3.8 (python3), but torch 2.13.0 needs Python 3.10 or later" in (
        proc.stdout
    ), proc.stdout[-3000:]


def test_a_torchvision_that_does_not_import_fails_the_play(converged_ubuntu_cluster, wheelhouse, tmp_path):
    """Failure 5: torch from the wheelhouse and PyPI's torchvision (built for another torch) installed fine,
    and site.yml reported success though `import torchvision` fails. The role now imports what it
    installed and names the package, and records no environment that does not import. (Built under
    another name, so the node's own environment stays; a changed spec rebuilding it is the next test's.)"""
    node = converged_ubuntu_cluster.node("node2")
    recorded = on_node(node, "cat /etc/clustercheck/python").stdout
    mixed = tmp_path / "wheelhouse"
    shutil.copytree(wheelhouse, mixed)
    subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "pip") if (REPO / ".venv" / "bin" / "pip").exists() else "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(mixed),
            "torchvision==0.28.0",
            "numpy",  # torchvision's own requirements, so pip installs it and only the import can fail
            "pillow",
        ],
        check=True,
        timeout=600,
    )
    try:
        broken = ansible_playbook(
            converged_ubuntu_cluster,
            mixed,
            "--tags",
            "python_env",
            "--limit",
            "node2",
            "-e",
            "python_env_torchvision_version=0.28.0",
            "-e",
            "python_env_name=torchvision-mismatch",
        )
        assert broken.returncode != 0, broken.stdout[-3000:]
        assert re.search(r"torchvision does not import \(\w+: .*torchvision::nms does not exist", broken.stdout), (
            broken.stdout[-3000:]
        )
        assert "torchvision-mismatch" in broken.stdout  # the environment named where it failed
        assert on_node(node, "cat /etc/clustercheck/python").stdout == recorded  # not recorded for clustercheck
    finally:
        on_node(node, "rm -rf /opt/venvs/torchvision-mismatch", check=False)


def test_a_package_removed_from_the_spec_leaves_the_environment(converged_ubuntu_cluster, wheelhouse):
    """A node added later equals the others: the environment follows the spec, removals included."""
    node = converged_ubuntu_cluster.node("node3")
    python = on_node(node, "cat /etc/clustercheck/python").stdout.strip()
    extra = ansible_playbook(
        converged_ubuntu_cluster,
        wheelhouse,
        "--tags",
        "python_env",
        "--limit",
        "node3",
        "-e",
        json.dumps({"python_env_packages": ["mpmath==1.3.0", "filelock==4.2.11"]}),
    )
    assert extra.returncode == 0, extra.stdout[-3000:]
    assert on_node(node, f"{python} -m pip show filelock", check=False).returncode == 0
    back = ansible_playbook(converged_ubuntu_cluster, wheelhouse, "--tags", "python_env", "--limit", "node3")
    assert back.returncode == 0, back.stdout[-3000:]
    assert on_node(node, f"{python} -m pip show filelock", check=False).returncode != 0
    assert on_node(node, f"{python} -c 'import mpmath'").returncode == 0


def test_cloud_init_rewriting_etc_hosts_keeps_the_cluster_mapping(converged_ubuntu_cluster, wheelhouse):
    """Fix 10: where cloud-init manages /etc/hosts (manage_etc_hosts: true), it rewrites the file from its
    template and brings back '127.0.1.1 <hostname>'. With Ubuntu's real cloud-init and its hosts module
    run again, the cluster mapping stays and the own name is not on loopback."""
    node = converged_ubuntu_cluster.node("node2")
    on_node(
        node,
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cloud-init"
        " >/dev/null && printf 'datasource_list: [ None ]\\nmanage_etc_hosts: true\\n'"
        " > /etc/cloud/cloud.cfg.d/99-clustercheck-test.cfg",
    )
    try:
        proc = ansible_playbook(converged_ubuntu_cluster, wheelhouse, "--tags", "cluster_hosts", "--limit", "node2")
        assert proc.returncode == 0, proc.stdout[-3000:]
        rerun = on_node(node, "cloud-init single --name cc_update_etc_hosts --frequency always 2>&1", check=False)
        assert "update_etc_hosts" in rerun.stdout or rerun.returncode == 0, rerun.stdout[-2000:]
        hosts = on_node(node, "cat /etc/hosts").stdout
        assert "manage_etc_hosts" in on_node(node, "cat /etc/hosts; cat /etc/cloud/templates/hosts.debian.tmpl").stdout
        for peer in converged_ubuntu_cluster.nodes:
            assert re.search(rf"^{re.escape(peer.address)} {peer.name}\b", hosts, re.M), hosts
        assert not re.search(r"^127\.0\.[01]\.1\s.*\bnode2\b", hosts, re.M), hosts
    finally:
        purge = "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq cloud-init >/dev/null; rm -rf /etc/cloud"
        on_node(node, purge, check=False)


def test_firewall_guard_refuses_under_become(wheelhouse):
    """Failure 2: connected as a sudo user, the guard read SSH_CLIENT from facts gathered under sudo
    (which drops it), never fired, and enabled ufw with rules that did not hold the control machine: the
    node was lost. On a fresh Ubuntu 24.04 node reached as `ops` with become, it now refuses, says why,
    and leaves ufw off and the node reachable."""
    with own_cluster(1, "firewall test node", "-fw", os_name="ubuntu24.04", user=UBUNTU_USER) as fresh:
        node = fresh.nodes[0]
        on_node(node, "apt-get update -qq")  # package lists, as a running server has them: ufw can install
        proc = ansible_playbook(
            fresh,
            wheelhouse,
            "--tags",
            "firewall",
            "-e",
            "cluster_cidr=10.99.0.0/24",
            "-e",
            "admin_cidr=192.0.2.0/24",
        )
        assert proc.returncode != 0, proc.stdout[-3000:]
        gateway = fresh.apt_proxy.split("//")[1].split(":")[0] if fresh.apt_proxy else ""
        assert re.search(
            r"Ansible reaches node1 from [\d.]+, which is in neither firewall_admin_cidr \(192\.0\.2\.0/24\) nor the "
            r"cluster network \(10\.99\.0\.0/24\): enabling the firewall would lock this control machine out",
            proc.stdout,
        ), proc.stdout[-3000:]
        if gateway:
            assert f"from {gateway}," in proc.stdout
        ufw = on_node(node, "ufw status 2>/dev/null || echo 'not installed'", check=False).stdout
        assert "Status: active" not in ufw
        ping = subprocess.run(
            [
                "ssh",
                "-i",
                fresh.key_file,
                "-o",
                f"UserKnownHostsFile={fresh.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "ConnectTimeout=10",
                f"{UBUNTU_USER}@{node.address}",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )
        assert ping.returncode == 0, ping.stderr
