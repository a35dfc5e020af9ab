"""The nodes a command works on, from --hosts and --limit (inventory.py), and the SSH settings that reach them, from
the SSH options (--ssh-config, --known-hosts, --accept-new-host-keys, --connect-timeout): the same for run, launch,
jobs, logs and stop. A bad inventory, an SSH configuration that cannot be read, or an SSH option a node's connection
needs that clustercheck cannot honour (sshoptions.py) is a UsageError, no node matched NoHosts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clustercheck import inventory
from clustercheck.exitcodes import NoHosts, UsageError
from clustercheck.inventory import Node
from clustercheck.transport import TransportError
from clustercheck.transport.params import SshSettings, Timeouts, load_config, resolve

DEFAULT_CONNECT_TIMEOUT = 10  # --connect-timeout: seconds for a node's TCP connection (--help shows it as written)


@dataclass(frozen=True)
class SshOptions:
    """The SSH options as given."""

    config: str | None = None  # --ssh-config: read alone, instead of ~/.ssh/config and /etc/ssh/ssh_config
    known_hosts: tuple[str, ...] = ()  # --known-hosts
    accept_new_host_keys: bool = False
    connect_timeout: float = float(DEFAULT_CONNECT_TIMEOUT)

    def settings(self, nodes: Iterable[Node] = ()) -> SshSettings:
        """The settings for NODES: the SSH configuration read only when one of them is reached over SSH."""
        if self.config and not Path(self.config).exists():
            raise UsageError(f"--ssh-config {self.config}: no such file")
        try:
            config = load_config(self.config) if any(not n.is_local for n in nodes) else None
        except TransportError as exc:
            raise UsageError(str(exc)) from exc
        timeout = self.connect_timeout
        return SshSettings(
            timeouts=Timeouts(connect=timeout, banner=timeout + 5, auth=timeout + 5),
            accept_new_host_keys=self.accept_new_host_keys,
            known_hosts=self.known_hosts,
            config=config,
        )


def load(hosts: str, limit: str | None, ssh: SshOptions) -> tuple[list[Node], SshSettings]:
    """The nodes --hosts HOSTS --limit LIMIT names, in inventory order, and the settings that reach them."""
    try:
        nodes = inventory.load(hosts, limit)
    except inventory.InventoryError as exc:
        raise UsageError(str(exc)) from exc
    if not nodes:
        raise NoHosts(f"no host matched --hosts {hosts}" + (f" --limit {limit}" if limit else ""))
    settings = ssh.settings(nodes)
    for node in nodes:
        if not node.is_local:
            try:  # an option clustercheck cannot do as OpenSSH would is said now, not met as a failed connection
                resolve(node, settings.config, list(settings.known_hosts) or None)
            except (TransportError, ValueError) as exc:
                raise UsageError(str(exc)) from exc
    return nodes, settings


def inventory_path(hosts: str | None) -> str | None:
    """--hosts as the user gave it when it is an inventory (a file or directory), for the fix commands' -i; a host
    list or localhost is none."""
    return hosts if hosts and Path(hosts).exists() else None
