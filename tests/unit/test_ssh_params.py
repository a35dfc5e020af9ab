"""How SSH connection parameters are merged: inventory, -o options, ~/.ssh/config, --known-hosts."""

from __future__ import annotations

import paramiko

from clustercheck.inventory import Node
from clustercheck.transport.params import GLOBAL_KNOWN_HOSTS, resolve

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
