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


def overlaps(networks, reserved):
    """'A overlaps B' for every network of NETWORKS (CIDRs, or an address with its prefix) that shares addresses with
    one of RESERVED (CIDRs; empty ones and 'any' are left out)."""
    found = []
    for text in networks:
        mine = ipaddress.ip_network(str(text), strict=False)
        for other in reserved:
            if not other or str(other).lower() == "any":
                continue
            theirs = ipaddress.ip_network(str(other), strict=False)
            if mine.version == theirs.version and mine.overlaps(theirs):
                found.append(f"{text} overlaps {other}")
    return found


class FilterModule:
    def filters(self):
        return {
            "clustercheck_in_cidr": in_cidr,
            "clustercheck_network_of": network_of,
            "clustercheck_interfaces_in_cidr": interfaces_in_cidr,
            "clustercheck_overlaps": overlaps,
        }
