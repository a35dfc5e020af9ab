"""How SSH connection parameters are merged: inventory, -o options, ~/.ssh/config, --known-hosts."""

from __future__ import annotations

import paramiko
import pytest

from clustercheck.inventory import Node
from clustercheck.transport import TransportError
from clustercheck.transport.params import GLOBAL_KNOWN_HOSTS, read_config, resolve

CONFIG = """
Host gpu*
    User ubuntu
    Port 2222
    IdentityFile ~/.ssh/gpu_key
    UserKnownHostsFile ~/.ssh/cluster_known_hosts
    ProxyJump admin@bastion

Host gpu01
    HostName 10.0.0.11
"""


def test_ssh_config_fills_what_the_inventory_leaves_open(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = paramiko.SSHConfig.from_text(CONFIG)
    params = resolve(Node(name="gpu01", address="gpu01"), config)
    assert (params.hostname, params.port, params.user) == ("10.0.0.11", 2222, "ubuntu")
    assert params.key_files == [f"{tmp_path}/.ssh/gpu_key"]
    assert params.user_known_hosts == [f"{tmp_path}/.ssh/cluster_known_hosts"]
    assert params.global_known_hosts == [GLOBAL_KNOWN_HOSTS]
    assert params.proxy_jump == "admin@bastion"


def test_inventory_values_and_options_win_over_the_config():
    config = paramiko.SSHConfig.from_text(CONFIG)
    node = Node(
        name="gpu01",
        address="gpu01",
        port=22,
        user="root",
        key_file="/keys/id",
        ssh_options={"userknownhostsfile": "/state/known_hosts", "proxyjump": "none"},
    )
    params = resolve(node, config)
    assert (params.port, params.user, params.key_files) == (22, "root", ["/keys/id"])
    assert params.user_known_hosts == ["/state/known_hosts"]
    assert params.proxy_jump is None


def test_known_hosts_option_replaces_the_user_file_not_the_global_one():
    params = resolve(Node(name="n1", address="10.0.0.1"), None, ["/tmp/kh"])
    assert params.user_known_hosts == ["/tmp/kh"]
    assert params.global_known_hosts == [GLOBAL_KNOWN_HOSTS]
    default = resolve(Node(name="n1", address="10.0.0.1"), None)
    assert default.user_known_hosts[0].endswith("/.ssh/known_hosts")


# What the setup's ssh_trust role writes (roles/ssh_trust/templates/ssh_config.j2, as rendered on the test cluster).
CLUSTER_DROP_IN = """# Ansible managed
# Node-to-node SSH inside the cluster: the cluster key, and host keys checked against
# /etc/ssh/ssh_known_hosts.
Host node1 172.30.80.11 node2 172.30.80.12 node3 172.30.80.13
    IdentityFile ~/.ssh/id_cluster_ed25519
    StrictHostKeyChecking yes
    BatchMode yes
"""


def test_the_system_config_and_its_includes_are_read_after_the_users_as_openssh_does(tmp_path, monkeypatch):
    """On a cluster node, the cluster key is named in /etc/ssh/ssh_config.d/ (Debian's and Ubuntu's ssh_config
    starts with `Include /etc/ssh/ssh_config.d/*.conf`): clustercheck run there must use it, as ssh does."""
    monkeypatch.setenv("HOME", str(tmp_path))
    drop_ins = tmp_path / "ssh_config.d"
    drop_ins.mkdir()
    (drop_ins / "50-clustercheck.conf").write_text(CLUSTER_DROP_IN)
    system = tmp_path / "ssh_config"
    system.write_text(f"Include {drop_ins}/*.conf\n\nHost *\n    SendEnv LANG LC_*\n    HashKnownHosts yes\n")
    user = tmp_path / ".ssh" / "config"
    user.parent.mkdir()
    user.write_text("User ops\n\nHost node3\n    IdentityFile ~/.ssh/own_key\n    Port 2200\n")
    config = read_config([str(user), str(system)])
    node2 = resolve(Node(name="node2", address="node2"), config)
    assert node2.key_files == [f"{tmp_path}/.ssh/id_cluster_ed25519"] and node2.user == "ops"
    node3 = resolve(Node(name="node3", address="node3"), config)
    assert node3.port == 2200 and node3.key_files[0] == f"{tmp_path}/.ssh/own_key"  # the user's file first
    other = resolve(Node(name="gpu9", address="gpu9"), config)
    assert other.key_files == [] and other.port == 22
    # The user's file alone (as `ssh -F FILE`): no cluster key.
    assert resolve(Node(name="node2", address="node2"), read_config([str(user)])).key_files == []
    assert read_config([str(tmp_path / "none")]) is None


def test_an_include_that_loops_is_one_error_not_a_hang(tmp_path):
    looping = tmp_path / "config"
    looping.write_text(f"Include {looping}\n")
    with pytest.raises(TransportError, match="Include nested more than"):
        read_config([str(looping)])
