"""Host keys, with OpenSSH's rules: known_hosts (hashed and [host]:port entries too) and the global file; an
unknown key is refused unless the user opts in (like StrictHostKeyChecking=accept-new); a changed key is always
refused."""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from pathlib import Path

import paramiko

from clustercheck.transport import HostKeyError, TransportError
from clustercheck.transport.params import USER_KNOWN_HOSTS, ConnectParams

_record_lock = threading.Lock()


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class Policy(paramiko.MissingHostKeyPolicy):
    """What to do with a key known_hosts does not have: refuse, or (accept_new) record it in the user file."""

    def __init__(self, name: str, params: ConnectParams, accept_new: bool) -> None:
        self.name, self.params, self.accept_new = name, params, accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        entry = known_hosts_name(self.params.hostname, self.params.port)
        kind = key.get_name()
        files = " or ".join(self.params.user_known_hosts + self.params.global_known_hosts) or "no known_hosts file"
        if not self.accept_new or not self.params.user_known_hosts:
            port = f"-p {self.params.port} " if self.params.port != 22 else ""
            target = self.params.user_known_hosts[0] if self.params.user_known_hosts else USER_KNOWN_HOSTS
            raise HostKeyError(
                f"{self.name}: unknown host key for {entry} ({kind} {fingerprint(key)}), not in {files}; "
                f"check the fingerprint on the node (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then add it "
                f"(ssh-keyscan {port}{self.params.hostname} >> {target}) or rerun with --accept-new-host-keys"
            )
        record = Path(self.params.user_known_hosts[0])
        with _record_lock:
            record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(record, "a") as fh:
                if record.stat().st_size == 0:
                    os.fchmod(fh.fileno(), 0o600)
                fh.write(f"{entry} {kind} {key.get_base64()}\n")
        client.get_host_keys().add(entry, kind, key)


def changed(name: str, params: ConnectParams, exc: paramiko.BadHostKeyException) -> HostKeyError:
    return HostKeyError(
        f"{name}: HOST KEY CHANGED for {known_hosts_name(params.hostname, params.port)}: "
        f"the node offered {exc.key.get_name()} {fingerprint(exc.key)}, known_hosts has "
        f"{fingerprint(exc.expected_key)}; refused. If the node was reinstalled, remove the old key "
        f"(ssh-keygen -R {params.hostname}) and verify the new one"
    )


def load(client: paramiko.SSHClient, params: ConnectParams) -> None:
    """The global files, then the user's, into CLIENT."""
    for path in params.global_known_hosts:
        _load(client, path, system=True)
    for path in params.user_known_hosts:
        _load(client, path, system=False)


def _load(client: paramiko.SSHClient, path: str, system: bool) -> None:
    if not os.path.exists(path):
        return
    try:
        if system:
            client.load_system_host_keys(path)
        else:
            client.get_host_keys().load(path)
    except (OSError, paramiko.SSHException) as exc:
        raise TransportError(f"cannot read known_hosts file {path}: {exc}") from exc
