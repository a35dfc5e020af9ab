"""Making a node's transport: local for a local connection, SSH (with the run's SSH settings) otherwise.

The pipeline receives a factory, so its tests drive it with fake transports (unreachable nodes, refused host
keys) and no network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clustercheck.inventory import Node
from clustercheck.transport import Transport, TransportError
from clustercheck.transport.local import LocalTransport
from clustercheck.transport.params import SshSettings, resolve


@dataclass
class Connected:
    transport: Transport
    description: str  # the connect check's message: how the node was reached
    data: dict[str, Any] = field(default_factory=dict)


# node, run id, a callback that receives the transport before it connects (so an abort can reach it) -> Connected.
# Raises TransportError (HostKeyError for a host-key refusal) with the data to report in `.data` when known.
Factory = Callable[[Node, str, Callable[[Transport], None]], Connected]


def default(settings: SshSettings) -> Factory:
    def connect(node: Node, run_id: str, register: Callable[[Transport], None]) -> Connected:
        if node.is_local:
            transport = LocalTransport(node.name, run_id)
            register(transport)
            return Connected(transport, "local")
        # Imported for SSH only: paramiko's import is most of the start of a command that needs no SSH.
        from clustercheck.transport.hostkeys import known_hosts_name
        from clustercheck.transport.ssh import SSHTransport

        try:
            params = resolve(node, settings.config, list(settings.known_hosts) or None)
        except ValueError as exc:
            raise TransportError(f"{node.name}: {exc}") from exc
        ssh = SSHTransport(
            node.name,
            params,
            run_id=run_id,
            timeouts=settings.timeouts,
            accept_new_host_keys=settings.accept_new_host_keys,
            config=settings.config,
        )
        register(ssh)
        where = {"hostname": params.hostname, "port": params.port}
        if params.route:
            where["via"] = params.proxy_command or f"ProxyJump {params.proxy_jump}"
        try:
            ssh.connect()
        except TransportError as exc:
            exc.data = where  # type: ignore[attr-defined]
            raise
        user = params.user or "(default user)"
        return Connected(
            ssh,
            f"SSH to {known_hosts_name(params.hostname, params.port)} as {user}{params.route}, host key verified",
            {**where, "user": params.user},
        )

    return connect
