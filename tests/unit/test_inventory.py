"""Inventory parsing: ansible-inventory --list JSON (recorded), host lists and --limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clustercheck import inventory
from clustercheck.inventory import (
    InventoryError,
    Node,
    from_ansible_list,
    load,
    node_from_vars,
    parse_host_list,
    parse_ssh_options,
)

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_ansible_variables_and_group_vars_are_read():
    nodes = {n.name: n for n in from_ansible_list(recorded("ansible-inventory-list.json"))}
    assert list(nodes) == ["gpu01", "gpu02", "local1", "login"]
    gpu02 = nodes["gpu02"]
    assert (gpu02.address, gpu02.port, gpu02.user) == ("10.0.0.12", 2222, "admin")
    assert gpu02.key_file == "~/.ssh/cluster_ed25519"
    assert gpu02.gpus_expected == 8
    assert gpu02.cluster_interface == "ens5"
    assert gpu02.cluster_cidr == "10.0.0.0/24"
    assert gpu02.python == "/opt/clustercheck/venv/bin/python"
    assert gpu02.ssh_options == {"userknownhostsfile": "/etc/cc/known_hosts", "stricthostkeychecking": "yes"}
    assert nodes["local1"].is_local and not gpu02.is_local
    assert nodes["login"].gpus_expected is None  # the head group does not set gpus_per_node


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("gpu_nodes", ["gpu01", "gpu02", "local1"]),
        ("head", ["login"]),
        ("gpu0*", ["gpu01", "gpu02"]),
        ("gpu_nodes:!local1", ["gpu01", "gpu02"]),
        ("all,!gpu02", ["gpu01", "local1", "login"]),
        ("gpu_nodes:&gpu0*", ["gpu01", "gpu02"]),
        ("nosuchhost", []),
    ],
)
def test_limit_selects_groups_and_hosts(limit, expected):
    assert [n.name for n in from_ansible_list(recorded("ansible-inventory-list.json"), limit)] == expected


def test_templated_and_vaulted_values_are_clear_errors():
    data = recorded("ansible-inventory-templated-vaulted.json")
    with pytest.raises(InventoryError, match=r"n1: ansible_ssh_private_key_file is a template"):
        from_ansible_list(data, "n1")
    vaulted = {
        "_meta": {"hostvars": {"n2": {"ansible_user": data["_meta"]["hostvars"]["n2"]["ansible_become_password"]}}}
    }
    vaulted["all"] = {"hosts": ["n2"]}
    with pytest.raises(InventoryError, match="n2: ansible_user is vaulted"):
        from_ansible_list(vaulted)
    # A vaulted variable clustercheck does not read (become password) does not stop the run.
    assert [n.name for n in from_ansible_list(data, "n2")] == ["n2"]


def test_host_list_forms():
    nodes = parse_host_list("node1, root@node2:2222,[fe80::1]:2200,localhost")
    assert [(n.name, n.user, n.port, n.connection) for n in nodes] == [
        ("node1", None, None, "ssh"),
        ("node2", "root", 2222, "ssh"),
        ("fe80::1", None, 2200, "ssh"),
        ("localhost", None, None, "local"),
    ]


@pytest.mark.parametrize("spec", ["node1:99999", "@node1", "node1,node1", "node1:http", ",", " , ,"])
def test_bad_host_lists_are_errors(spec):
    with pytest.raises(InventoryError):
        parse_host_list(spec)


def test_ssh_options_from_ansible_args():
    options = parse_ssh_options("-o UserKnownHostsFile=/tmp/kh -oStrictHostKeyChecking=yes -J jump@bastion:2222")
    assert options == {
        "userknownhostsfile": "/tmp/kh",
        "stricthostkeychecking": "yes",
        "proxyjump": "jump@bastion:2222",
    }


def test_real_inventory_files_go_through_ansible_inventory(tmp_path):
    nodes = load(str(DATA / "inventory.ini"), "gpu_nodes")
    assert [n.name for n in nodes] == ["gpu01", "gpu02", "local1"]
    with pytest.raises(InventoryError, match="no such inventory"):
        load(str(tmp_path / "missing.ini"))
    broken = tmp_path / "broken.yml"
    broken.write_text("all:\n  hosts: [unclosed\n")
    with pytest.raises(InventoryError, match=r"broken\.yml"):
        load(str(broken))


def test_ansible_inventory_is_the_documented_json():
    """The recorded listing is what this ansible-core prints (so the recording cannot go stale unnoticed)."""
    tool = Path(sys.executable).parent / "ansible-inventory"
    live = subprocess.run([str(tool), "-i", str(DATA / "inventory.ini"), "--list"], capture_output=True, text=True)
    assert json.loads(live.stdout) == recorded("ansible-inventory-list.json")


def test_data_paths_from_the_inventory_are_a_list_or_comma_separated():
    assert node_from_vars("n1", {"clustercheck_data_paths": ["/data/a", "/data/b"]}).data_paths == (
        "/data/a",
        "/data/b",
    )
    assert node_from_vars("n1", {"clustercheck_data_paths": "/data/a, /data/b"}).data_paths == ("/data/a", "/data/b")
    assert node_from_vars("n1", {}).data_paths == ()
    with pytest.raises(InventoryError, match="clustercheck_data_paths must be a list of paths"):
        node_from_vars("n1", {"clustercheck_data_paths": {"a": 1}})


def test_the_packages_the_python_env_role_installs_are_read_as_distribution_names():
    node = inventory.node_from_vars(
        "gpu01", {"python_env_packages": ["lightning==2.5.1", "numpy >=1.26", "hydra-core[extra]", "{{ pkgs }}"]}
    )
    assert node.packages == ("lightning", "numpy", "hydra-core")
    with pytest.raises(inventory.InventoryError, match="must be a list"):
        inventory.node_from_vars("gpu01", {"python_env_packages": "lightning"})


def test_the_expected_transport_is_read_and_a_wrong_value_is_a_clear_error():
    from clustercheck.inventory import node_from_vars

    assert node_from_vars("gpu01", {"clustercheck_expect_transport": "IB"}).expect_transport == "ib"
    assert node_from_vars("gpu01", {}).expect_transport is None
    with pytest.raises(
        InventoryError, match="gpu01: clustercheck_expect_transport is 'infiniband', not one of ib, roce, socket"
    ):
        node_from_vars("gpu01", {"clustercheck_expect_transport": "infiniband"})


def test_a_cluster_value_is_the_one_the_nodes_agree_on_and_different_ones_are_refused_by_node():
    """clustercheck_min_busbw, clustercheck_data_paths, clustercheck_expected_file: one value for the run; nodes that
    leave one unset do not disagree, nodes that set different ones are named with their values."""
    nodes = [
        Node("node1", "10.0.0.1", min_busbw="40", data_paths=("/data", "/ckpt")),
        Node("node2", "10.0.0.2"),
        Node("node3", "10.0.0.3", min_busbw="40", data_paths=("/data", "/ckpt"), expected_file="/etc/h100.yml"),
    ]
    assert inventory.cluster_value(nodes, inventory.MIN_BUSBW_VAR) == "40"
    assert inventory.cluster_value(nodes, inventory.DATA_PATHS_VAR) == ("/data", "/ckpt")
    assert inventory.cluster_value(nodes, inventory.EXPECTED_FILE_VAR) == "/etc/h100.yml"
    assert inventory.cluster_value(nodes[1:2], inventory.MIN_BUSBW_VAR) is None
    assert inventory.cluster_value(nodes[1:2], inventory.DATA_PATHS_VAR) == ()
    nodes.append(Node("node4", "10.0.0.4", min_busbw="80:120", data_paths=("/data",)))
    with pytest.raises(InventoryError, match=r"^clustercheck_min_busbw differs between the nodes \(node1, node3: 40; "):
        inventory.cluster_value(nodes, inventory.MIN_BUSBW_VAR)
    with pytest.raises(InventoryError, match=r"\(node1, node3: /data,/ckpt; node4: /data\): it is one value for"):
        inventory.cluster_value(nodes, inventory.DATA_PATHS_VAR)
