"""Host keys, with OpenSSH's rules: known_hosts (hashed and [host]:port entries too) and the global file; an
unknown key is refused unless the user opts in (like StrictHostKeyChecking=accept-new); a changed key is always
refused.

Each known_hosts file is read once per run (again only when it changes) into an index of its lines by host name;
a connection builds key objects for its own host's lines only. paramiko's own loading parses every line into a key
object and compares it with every line before it, once per connection: on a cluster whose known_hosts lists every
node, that cost grows with the square of the nodes for each connection."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from dataclasses import dataclass, field
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
    """The keys known for the node into CLIENT: those of the global files when they name it (they come first, as
    in paramiko's own loading), else those of the user's files."""
    name = known_hosts_name(params.hostname, params.port)
    known = keys_for(params.global_known_hosts, name) or keys_for(params.user_known_hosts, name)
    for kind, blob in known:
        try:
            key = paramiko.PKey.from_type_string(kind, base64.b64decode(blob))
        except (paramiko.SSHException, ValueError, binascii.Error):
            continue  # a key type paramiko does not know, or a damaged line: as paramiko's loading skips it
        client.get_host_keys().add(name, kind, key)


def keys_for(paths: list[str], name: str) -> list[tuple[str, str]]:
    """(key type, base64 key) of every line of the known_hosts files PATHS that names NAME (a host or
    `[host]:port`), hashed entries included."""
    found: list[tuple[str, str]] = []
    for path in paths:
        found += _index(path).keys_for(name)
    return found


@dataclass
class KnownHosts:
    """One known_hosts file's lines by host name: plain names in a dict, hashed ones (|1|salt|hash) in a list."""

    plain: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    hashed: list[tuple[bytes, bytes, str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> KnownHosts:
        """The lines paramiko's loader takes: `names keytype base64 [comment]`; comments, blank lines, marked lines
        (@cert-authority, @revoked) and lines with fewer fields are left out, as it leaves them out."""
        index = cls()
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 3 or fields[0].startswith(("#", "@")):
                continue
            names, kind, blob = fields[:3]
            for host in names.split(","):
                if host.startswith("|1|"):
                    salt, _, digest = host[3:].partition("|")
                    try:
                        index.hashed.append((base64.b64decode(salt), base64.b64decode(digest), kind, blob))
                    except (binascii.Error, ValueError):
                        continue
                else:
                    index.plain.setdefault(host, []).append((kind, blob))
        return index

    def keys_for(self, name: str) -> list[tuple[str, str]]:
        found = list(self.plain.get(name, []))
        if self.hashed:
            encoded = name.encode()
            for salt, digest, kind, blob in self.hashed:
                if hmac.compare_digest(hmac.new(salt, encoded, hashlib.sha1).digest(), digest):
                    found.append((kind, blob))
        return found


_indexes: dict[str, tuple[tuple[int, int, int, int], KnownHosts]] = {}
_index_lock = threading.Lock()


def _index(path: str) -> KnownHosts:
    """PATH's index, read again only when the file changed (a key recorded with --accept-new-host-keys)."""
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return KnownHosts()
    except OSError as exc:
        raise TransportError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from exc
    signature = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _index_lock:
        cached = _indexes.get(path)
        if cached and cached[0] == signature:
            return cached[1]
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        raise TransportError(f"cannot read known_hosts file {path}: {exc.strerror or exc}") from exc
    index = KnownHosts.parse(text)
    with _index_lock:
        _indexes[path] = (signature, index)
    return index
