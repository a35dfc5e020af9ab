"""Where and how to reach a node over SSH: the inventory, ~/.ssh/config and the command line, merged.

Pure: nothing here connects. The result, ConnectParams, is what the SSH transport connects with.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from clustercheck.transport import TransportError

if TYPE_CHECKING:
    import paramiko  # imported where a config is read: paramiko's import is most of a command's start

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"


class Target(Protocol):
    """What the merge needs to know about a host (an inventory Node is one)."""

    name: str
    address: str
    port: int | None
    user: str | None
    key_file: str | None
    ssh_options: dict[str, str]


@dataclass(frozen=True)
class Host:
    """A host that is not in the inventory: a ProxyJump hop."""

    name: str
    address: str
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    ssh_options: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeouts:
    connect: float = 10.0  # TCP connect
    banner: float = 15.0  # the server's SSH banner after connecting
    auth: float = 15.0  # authentication


@dataclass(frozen=True)
class SshSettings:
    """The run's SSH settings from the command line: the same for every node."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    accept_new_host_keys: bool = False
    known_hosts: tuple[str, ...] = ()  # replaces the user's known_hosts files when given
    config: paramiko.SSHConfig | None = None


@dataclass
class ConnectParams:
    """Where and how to connect, after the inventory, ~/.ssh/config and the command line are merged."""

    hostname: str
    port: int = 22
    user: str | None = None
    key_files: list[str] = field(default_factory=list)
    user_known_hosts: list[str] = field(default_factory=list)  # unknown keys are recorded in the first
    global_known_hosts: list[str] = field(default_factory=list)
    proxy_jump: str | None = None


def resolve(target: Target, config: paramiko.SSHConfig | None, known_hosts: list[str] | None = None) -> ConnectParams:
    """Merge, highest first: --known-hosts, the inventory (ansible_* and -o options), ~/.ssh/config, defaults."""
    looked = dict(config.lookup(target.address)) if config else {}
    options = {**looked, **target.ssh_options}  # -o on the command line wins over the config file, as in OpenSSH
    hostname = options.get("hostname", target.address) if target.address == target.name else target.address
    if "hostname" in target.ssh_options:
        hostname = target.ssh_options["hostname"]
    port = target.port or int(options.get("port", 22))
    keys = [target.key_file] if target.key_file else _as_list(options.get("identityfile"))
    user_files = known_hosts or _as_list(options.get("userknownhostsfile")) or [USER_KNOWN_HOSTS]
    global_files = _as_list(options.get("globalknownhostsfile")) or [GLOBAL_KNOWN_HOSTS]
    jump = options.get("proxyjump")
    return ConnectParams(
        hostname=hostname,
        port=port,
        user=target.user or options.get("user"),
        key_files=[os.path.expanduser(k) for k in keys],
        user_known_hosts=[os.path.expanduser(f) for f in user_files if f != "/dev/null"],
        global_known_hosts=[os.path.expanduser(f) for f in global_files if f != "/dev/null"],
        proxy_jump=None if jump in (None, "none") else jump,
    )


def jump_host(spec: str) -> Host:
    """`[user@]host[:port]` of a ProxyJump; one hop only."""
    if "," in spec:
        raise TransportError(f"ProxyJump {spec}: only one jump host is supported")
    user, _, hostport = spec.rpartition("@")
    host, _, port = hostport.partition(":")
    if port and not port.isdigit():
        raise TransportError(f"ProxyJump {spec}: bad port")
    return Host(name=host, address=host, port=int(port) if port else None, user=user or None)


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value).split()


def load_config(path: str | None) -> paramiko.SSHConfig | None:
    """The SSH configuration as OpenSSH reads it: PATH alone when given (`ssh -F`), else the user's ~/.ssh/config
    and then the system's /etc/ssh/ssh_config (where the setup's ssh_trust role names the cluster key, in a file its
    Include reads), the first value found winning; None when there is none."""
    files = [path] if path else [USER_CONFIG, SYSTEM_CONFIG]
    return read_config([os.path.expanduser(f) for f in files])


USER_CONFIG = "~/.ssh/config"
SYSTEM_CONFIG = "/etc/ssh/ssh_config"
INCLUDE_DEPTH = 16  # as OpenSSH's limit on nested Include


def read_config(files: list[str]) -> paramiko.SSHConfig | None:
    """FILES, the existing ones, as one configuration: each begins at the top level (its lines before any Host
    apply to every host), `Include` expanded where it stands (relative names against ~/.ssh for the user's file,
    /etc/ssh otherwise, globs in name order), which paramiko's parser does not do."""
    import paramiko

    texts = []
    for path in files:
        if not os.path.exists(path):
            continue
        base = (
            os.path.dirname(os.path.expanduser(USER_CONFIG)) if path == os.path.expanduser(USER_CONFIG) else "/etc/ssh"
        )
        try:
            texts.append("Host *\n" + _included(path, base, 0))
        except OSError as exc:
            raise TransportError(f"cannot read SSH config {path}: {exc.strerror or exc}") from exc
    if not texts:
        return None
    try:
        return paramiko.SSHConfig.from_text("\n".join(texts))
    except (paramiko.SSHException, ValueError) as exc:
        raise TransportError(f"cannot read SSH config {', '.join(files)}: {exc}") from exc


def _included(path: str, base: str, depth: int) -> str:
    if depth > INCLUDE_DEPTH:
        raise TransportError(f"SSH config {path}: Include nested more than {INCLUDE_DEPTH} deep")
    lines = []
    with open(path, errors="replace") as fh:
        for line in fh:
            words = line.replace("=", " ", 1).split()
            if not words or words[0].lower() != "include":
                lines.append(line.rstrip("\n"))
                continue
            for pattern in words[1:]:
                pattern = os.path.expanduser(pattern)
                for name in sorted(glob.glob(pattern if os.path.isabs(pattern) else os.path.join(base, pattern))):
                    if os.path.isfile(name):
                        lines.append(_included(name, base, depth + 1))
    return "\n".join(lines)
