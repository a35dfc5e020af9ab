"""The firewall check on recorded `ufw status`, `nft list ruleset` and `iptables -S`/`iptables-save` outputs
(tests/unit/data/README.md says where each comes from): PASS only where incoming traffic is filtered, naming what
filters it; Docker's or Kubernetes' rules alone are no input filter, a FAIL where site.yml's firewall role manages
the node and a WARN elsewhere."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from clustercheck.checks import registry
from clustercheck.facts import collect, firewall, parse
from clustercheck.inventory import Node, from_ansible_list
from clustercheck.model import Status

DATA = Path(__file__).parent / "data" / "firewall"
MISSING = {"error": "not found"}


def answer(name: str) -> dict:
    return {"rc": 0, "out": (DATA / name).read_text()}


def state(ufw=MISSING, nft=MISSING, iptables=MISSING) -> dict:
    return parse.firewall_state(ufw, nft, iptables)


def firewall_result(node: Node, role_rules: bool = False, **commands):
    """The firewall check on COMMANDS' answers; ROLE_RULES: whether the firewall role's rules are in ufw's file."""
    facts = collect.build(
        node,
        {
            "python": {"version": "3.11.2"},
            "commands": {k: v for k, v in commands.items()},
            "firewall_role_rules": role_rules,
        },
        python="/usr/bin/python3",
        python_source="python3",
    )
    return next(r for r in registry.run_node_checks(facts) if r.name == "firewall")


@pytest.mark.parametrize(
    "nft, iptables",
    [
        ("nft-docker-only-debian12.txt", "iptables-S-docker-only-debian12.txt"),
        (None, "iptables-save-docker-kubernetes-kube-router-1069.txt"),
    ],
)
def test_docker_and_kubernetes_rules_alone_are_no_input_filter(nft, iptables):
    found = state(nft=answer(nft) if nft else MISSING, iptables=answer(iptables))
    assert found["collected"] and not found["active"]
    assert "Docker" in found["seen"] and "none filtering incoming traffic" in found["seen"]
    assert found["rules"] > 0


def test_kubernetes_chain_in_input_drops_only_some_packets():
    found = state(iptables=answer("iptables-save-docker-kubernetes-kube-router-1069.txt"))
    assert "Kubernetes" in found["seen"]


@pytest.mark.parametrize(
    "source, tool, words",
    [
        ({"ufw": "ufw-status-active-raspibolt-1492.txt"}, "ufw", "ufw"),
        ({"iptables": "iptables-S-ufw-cloudflareiptables-3.txt"}, "iptables", "INPUT: policy drop"),
        ({"iptables": "iptables-S-firewalld-input-firewalld-59.txt"}, "iptables", "INPUT: a final reject rule"),
        ({"nft": "nft-firewalld-filter-input-firewalld-1474.txt"}, "nftables", "filter_INPUT: a final reject"),
        ({"nft": "nft-input-policy-drop-opensnitch-1423.txt"}, "nftables", "table inet filter: policy drop"),
        ({"nft": "nft-input-final-reject-insights-core-1812.txt"}, "nftables", "INPUT of table ip filter"),
    ],
)
def test_an_input_hook_that_drops_by_default_is_named(source, tool, words):
    found = state(**{key: answer(name) for key, name in source.items()})
    assert found["active"] and found["tool"] == tool
    assert words in found["filter"]


def test_a_filter_in_either_tool_counts_whatever_the_other_holds():
    found = state(
        nft=answer("nft-docker-only-debian12.txt"), iptables=answer("iptables-S-firewalld-input-firewalld-59.txt")
    )
    assert found["active"] and found["tool"] == "iptables"


def test_what_cannot_be_read_is_not_collected_and_no_tool_at_all_filters_nothing():
    denied = {"rc": 1, "out": "", "err": "netlink: Error: Operation not permitted"}
    assert not state(nft=denied, iptables=denied)["collected"]
    nothing = state()
    assert nothing["collected"] and not nothing["active"]
    assert state(nft={"rc": 0, "out": ""}) == {"collected": True, "active": False, "tool": None, "rules": 0}


def test_docker_only_fails_where_the_firewall_role_manages_the_node_and_warns_elsewhere():
    commands = {
        "nft": answer("nft-docker-only-debian12.txt"),
        "iptables": answer("iptables-S-docker-only-debian12.txt"),
    }
    node = Node(name="node1", address="node1")
    plain = firewall_result(node, ufw={"rc": 0, "out": "Status: inactive\n"}, **commands)
    assert plain.status is Status.WARN
    assert "no input filter" in plain.message and "Docker" in plain.message
    inactive = {"rc": 0, "out": "Status: inactive\n"}
    managed = firewall_result(replace(node, firewall_role=True), role_rules=True, ufw=inactive, **commands)
    assert managed.status is Status.FAIL
    assert "firewall role" in managed.message and "--tags firewall" in managed.remediation
    # In the group site.yml sets up, but the role never ran there (no rules of its own in ufw's file): a WARN, not a
    # FAIL for every node of an inventory verified before site.yml (or set up some other way).
    never = firewall_result(replace(node, firewall_role=True), role_rules=False, ufw=inactive, **commands)
    assert never.status is Status.WARN and "no input filter" in never.message


def test_the_firewall_role_s_rules_are_found_in_ufw_s_rule_file_as_ufw_writes_comments(monkeypatch):
    """ufw keeps a rule's comment hex-encoded on its tuple line (`comment=636c...`): the role's rules are found in the
    file a converged test node holds, not in ufw's package default, and no file is no rule."""
    from clustercheck.remote import facts as node_side

    for name, found in (
        ("ufw-user-rules-testcluster-debian12.rules", True),
        ("ufw-user-rules-package-default-debian12.rules", False),
        ("no-such-file.rules", False),
    ):
        monkeypatch.setattr(node_side, "UFW_RULES", str(DATA / name))
        assert node_side.firewall_role_rules() is found, name


def test_a_filtered_node_passes_naming_what_filters_it():
    result = firewall_result(
        Node(name="node1", address="node1"), nft=answer("nft-input-policy-drop-opensnitch-1423.txt")
    )
    assert result.status is Status.PASS
    assert "policy drop" in result.message and "inet filter" in result.message


def test_the_inventory_says_where_the_firewall_role_manages_the_firewall():
    data = {
        "_meta": {"hostvars": {"a": {}, "b": {"firewall_enabled": False}, "c": {}, "d": {"firewall_enabled": "no"}}},
        "all": {"children": ["gpu_nodes", "head"]},
        "gpu_nodes": {"hosts": ["a", "b", "d"]},
        "head": {"hosts": ["c"]},
    }
    managed = {n.name: n.firewall_role for n in from_ansible_list(data)}
    assert managed == {"a": True, "b": False, "c": False, "d": False}


def _line(name: str, start: str) -> str:
    return next(line.strip() for line in (DATA / name).read_text().splitlines() if line.strip().startswith(start))


def test_a_rule_drops_by_its_own_verdict_and_is_stateful_by_its_state_match():
    """On rules as the tools listed them: the verdict is the rule's own (-j/-g target, nft's last verdict word), a
    jump to a chain named after rejecting is not one; a state match makes the rule spare established replies."""
    stateless = _line("iptables-S-stateless-reject-testcluster.txt", "-A CC-SR -s 172.30.80.12/32")
    assert firewall.drops(stateless) and not firewall.stateful(stateless)
    new_only = _line("iptables-S-ephemeral-drop-testcluster.txt", "-A CLUSTERCHECK-FAULTS -s 172.30.81.11/32")
    assert firewall.drops(new_only) and firewall.stateful(new_only)
    jump = _line("iptables-S-ufw-cloudflareiptables-3.txt", "-A INPUT -j ufw-reject-input")
    assert not firewall.drops(jump)
    nft = _line("nft-ephemeral-drop-testcluster.txt", "ip saddr 172.30.81.11 tcp dport 32768-45000")
    assert firewall.drops(nft) and firewall.stateful(nft)
    accept = _line("nft-docker-only-debian12.txt", 'oifname "docker0" ct state related,established')
    assert not firewall.drops(accept)
