"""What Ansible's facts say about a node, for the roles that decide on it (base, containers); ansible-core only."""

from __future__ import annotations

# Ansible's virtualization_type values of a container guest (its facts' virtual modules), as distinct from a VM's.
CONTAINER_TYPES = ("docker", "podman", "container", "containerd", "lxc", "systemd-nspawn")


def is_container(facts) -> bool:
    """True when FACTS (ansible_facts) say the node is a container: a guest whose virtualization is one of
    CONTAINER_TYPES. A VM (kvm, xen, ...) and a host (virtualization_role: host) are not."""
    facts = facts or {}
    return facts.get("virtualization_role", "") == "guest" and facts.get("virtualization_type", "") in CONTAINER_TYPES


class FilterModule:
    def filters(self):
        return {"clustercheck_is_container": is_container}
