"""cluster_hosts: every node's name resolves to its cluster address, never to loopback."""

from acceptance_helpers import addresses_of, is_loopback


def test_own_hostname_is_not_loopback(host):
    name = host.check_output("hostname")
    resolved = host.check_output(f"getent ahostsv4 {name} | awk '{{print $1}}' | sort -u").split()
    assert resolved, f"{name} does not resolve on itself"
    loopback = [a for a in resolved if is_loopback(a)]
    assert not loopback, (
        f"{name} resolves to {loopback} on itself: gloo and NCCL would bind to loopback (fix /etc/hosts)"
    )


def test_every_node_resolves_to_its_own_address(host, peers):
    for name, peer in peers.items():
        resolved = host.run(f"getent ahostsv4 {name}").stdout.split()
        assert resolved, f"{name} does not resolve on {host.backend.get_hostname()}"
        address = resolved[0]
        assert not is_loopback(address), f"{name} resolves to loopback {address}"
        assert address in addresses_of(peer), f"{name} resolves to {address}, which is not one of its addresses"
