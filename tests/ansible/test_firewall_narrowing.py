"""The firewall forgets what it no longer allows: after admin_cidr is narrowed, the next run removes the SSH rule for
the old network, and the old network no longer reaches port 22 while the new one does. Proved for real on the
converged test cluster (only `--tags firewall` on node1 runs): node2 connects to node1's sshd from one address in
each network. The lock-out guard still holds, and node1 is left as site.yml set it up."""

from __future__ import annotations

import subprocess

import pytest
from conftest import ansible_playbook
from harness import on
from test_site_playbook import changed_tasks, recap

pytestmark = pytest.mark.cluster

OLD, NEW = "192.0.2.0/24", "198.51.100.0/24"  # documentation networks (RFC 5737): nothing else uses them
FROM_OLD, FROM_NEW = "192.0.2.10", "198.51.100.10"

# Connect from SOURCE to ADDRESS:22 and print the SSH banner; a dropped connection times out (exit 1).
CONNECT = (
    "import socket, sys; s = socket.socket(); s.settimeout(4); s.bind((sys.argv[1], 0)); "
    "s.connect((sys.argv[2], 22)); print(s.recv(64).decode().strip())"
)


def reaches_ssh(client, source: str, target) -> bool:
    proc = subprocess.run(
        ["docker", "exec", client.container, "python3", "-c", CONNECT, source, target.address],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode == 0 and proc.stdout.startswith("SSH-")


def firewall(cluster, wheelhouse, *extra: str) -> subprocess.CompletedProcess:
    return ansible_playbook(cluster, wheelhouse, "--tags", "firewall", "--limit", "node1", *extra)


def test_narrowing_admin_cidr_removes_the_old_networks_ssh_rule(converged_cluster, wheelhouse):
    target, client = converged_cluster.node("node1"), converged_cluster.node("node2")
    # node2 gets an address in each network; node1 sends its answers to them back through node2.
    for address in (FROM_OLD, FROM_NEW):
        on(client, f"ip addr add {address}/32 dev eth0")
        on(target, f"ip route add {address}/32 via {client.address}")
    try:
        assert reaches_ssh(client, FROM_OLD, target) and reaches_ssh(client, FROM_NEW, target)  # admin_cidr: any

        first = firewall(converged_cluster, wheelhouse, "-e", f"admin_cidr={OLD}")
        assert first.returncode == 0, first.stdout[-4000:]
        assert reaches_ssh(client, FROM_OLD, target)
        assert not reaches_ssh(client, FROM_NEW, target), "the rule for admin_cidr 'any' is still there"

        narrowed = firewall(converged_cluster, wheelhouse, "-e", f"admin_cidr={NEW}")
        assert narrowed.returncode == 0, narrowed.stdout[-4000:]
        assert f"(item=allow from {OLD} to any port 22 proto tcp comment 'clustercheck SSH')" in narrowed.stdout
        assert not reaches_ssh(client, FROM_OLD, target), f"{OLD} still reaches port 22 after admin_cidr={NEW}"
        assert reaches_ssh(client, FROM_NEW, target)
        rules = on(target, "ufw show added").stdout
        assert OLD not in rules and f"from {NEW} to any port 22" in rules, rules
        assert "clustercheck cluster network" in rules, rules

        again = firewall(converged_cluster, wheelhouse, "-e", f"admin_cidr={NEW}")
        assert again.returncode == 0, again.stdout[-4000:]
        assert recap(again.stdout)["node1"]["changed"] == 0, "\n".join(changed_tasks(again.stdout))

        # The guard: settings that would not let the control machine in change nothing, removals included.
        refused = firewall(
            converged_cluster, wheelhouse, "-e", "admin_cidr=203.0.113.0/24", "-e", "cluster_cidr=10.99.0.0/24"
        )
        assert refused.returncode != 0, refused.stdout[-4000:]
        assert "enabling the firewall would lock this control machine out" in refused.stdout, refused.stdout[-4000:]
        assert on(target, "ufw show added").stdout == rules
        assert reaches_ssh(client, FROM_NEW, target)
    finally:
        restored = firewall(converged_cluster, wheelhouse)  # the session's settings: SSH from anywhere
        for address in (FROM_OLD, FROM_NEW):
            on(target, f"ip route del {address}/32", check=False)
            on(client, f"ip addr del {address}/32 dev eth0", check=False)
    assert restored.returncode == 0, restored.stdout[-4000:]
    assert NEW not in on(target, "ufw show added").stdout
