"""Address filters for the roles, so that they need nothing beyond ansible-core."""

from __future__ import annotations

import ipaddress


def in_cidr(address, cidr):
    """True when ADDRESS (an IPv4/IPv6 address) lies inside CIDR ('any' holds everything)."""
    if not address or not cidr:
        return False
    if str(cidr).lower() in ("any", "0.0.0.0/0", "::/0"):
        return True
    try:
        return ipaddress.ip_address(str(address)) in ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return False


def network_of(address, netmask):
    """The network (CIDR) of an address with its netmask: ('10.0.0.5', '255.255.255.0') -> '10.0.0.0/24'."""
    return str(ipaddress.ip_network(f"{address}/{netmask}", strict=False))


def interfaces_in_cidr(interfaces, cidr):
    """The interface facts (dicts with ipv4.address) whose IPv4 address lies inside CIDR."""
    return [i for i in interfaces if in_cidr(i.get("ipv4", {}).get("address"), cidr)]


class FilterModule:
    def filters(self):
        return {
            "clustercheck_in_cidr": in_cidr,
            "clustercheck_network_of": network_of,
            "clustercheck_interfaces_in_cidr": interfaces_in_cidr,
        }
