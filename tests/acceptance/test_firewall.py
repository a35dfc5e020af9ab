"""firewall: ufw active, deny incoming by default, all traffic from the cluster network allowed."""

import ipaddress

from acceptance_helpers import setting


def _cluster_network(host, runner) -> str:
    cidr = setting(runner, host.backend.get_hostname(), "cluster_cidr", "cluster_hosts", "cluster_hosts_cidr")
    if cidr and "{{" not in cidr:
        return str(ipaddress.ip_network(cidr, strict=False))
    ifname = host.run("printenv NCCL_SOCKET_IFNAME").stdout.strip()
    line = host.check_output(f"ip -4 -o addr show dev {ifname}")
    return str(ipaddress.ip_interface(line.split()[3]).network)


def test_ufw_active_and_denies_incoming(host):
    status = host.check_output("ufw status verbose")
    assert "Status: active" in status, status
    assert "deny (incoming)" in status, status


def test_cluster_network_allowed(host, runner):
    network = _cluster_network(host, runner)
    rules = [line.split() for line in host.check_output("ufw status").splitlines()]
    assert ["Anywhere", "ALLOW", network] in [r[:3] for r in rules], f"no rule allows everything from {network}"
