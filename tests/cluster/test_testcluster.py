"""The test cluster itself: nodes are real hosts, reached over SSH with host-key checking on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import paramiko
import pytest
import testcluster

pytestmark = pytest.mark.cluster


def inventory_hosts(path: str) -> dict[str, str]:
    """Node name -> address, read the way Ansible reads the inventory."""
    listing = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", path, "--list"],
        check=True,
        capture_output=True,
        text=True,
    )
    data = json.loads(listing.stdout)
    hostvars = data["_meta"]["hostvars"]
    return {name: hostvars[name]["ansible_host"] for name in data["gpu_nodes"]["hosts"]}


def ssh(address: str, known_hosts: str, key_file: str) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(address, username="root", key_filename=key_file, timeout=10, allow_agent=False, look_for_keys=False)
    return client


def test_every_node_answers_over_ssh_with_host_key_checking(cluster):
    hosts = inventory_hosts(cluster.inventory)
    assert sorted(hosts) == ["node1", "node2", "node3"]
    for name, address in hosts.items():
        with ssh(address, cluster.known_hosts, cluster.key_file) as client:
            _, stdout, _ = client.exec_command("hostname && systemctl is-system-running --wait")
            lines = stdout.read().decode().split()
            assert stdout.channel.recv_exit_status() in (0, 1)
            assert lines[0] == name
            assert lines[1] in ("running", "degraded")


def test_nodes_have_their_own_host_keys(cluster):
    keys = [
        line.split()[2]
        for line in Path(cluster.known_hosts).read_text().splitlines()
        if line.split()[1] == "ssh-ed25519"
    ]
    assert len(keys) == 3 and len(set(keys)) == 3


def test_an_unknown_host_key_is_refused(cluster, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        ssh(cluster.nodes[0].address, str(empty), cluster.key_file)


def test_password_login_is_off(cluster):
    transport = paramiko.Transport((cluster.nodes[0].address, 22))
    try:
        transport.start_client(timeout=10)
        with pytest.raises(paramiko.BadAuthenticationType) as excinfo:
            transport.auth_password("root", "root")
        assert "password" not in excinfo.value.allowed_types
    finally:
        transport.close()


def test_up_replaces_leftovers_of_an_earlier_run(cluster):
    """A crashed run leaves containers and a network behind; the next `up` must not trip over them."""
    name = f"{cluster.name}-leftover"
    label = f"{testcluster.LABEL}={name}"
    testcluster.docker("network", "create", "--label", label, "--subnet", "172.30.250.0/24", f"{name}-net")
    testcluster.docker("create", "--name", f"{name}-node1", "--label", label, cluster.image)
    try:
        fresh = testcluster.up(1, name=name)
        with ssh(fresh.nodes[0].address, fresh.known_hosts, fresh.key_file) as client:
            _, stdout, _ = client.exec_command("hostname")
            assert stdout.read().decode().strip() == "node1"
    finally:
        testcluster.down(name)
    assert testcluster._resources(name) == ([], [])
