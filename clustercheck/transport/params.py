"""Where and how to reach a node over SSH: the inventory, ~/.ssh/config and the command line, merged.

Pure: nothing here connects. The result, ConnectParams, is what the SSH transport connects with.
"""

from __future__ import annotations

import getpass
import glob
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from clustercheck import sshoptions
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


class UnhonouredOption(TransportError):
    """An SSH option clustercheck cannot do as OpenSSH would (sshoptions.py says which and why): a usage error."""


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
    proxy_jump: str | None = None  # as written: the hops, comma-separated
    jumps: list[ConnectParams] = field(default_factory=list)  # each hop of proxy_jump, resolved, in order
    proxy_command: str | None = None  # with its %-tokens substituted; run through the user's shell
    connect_timeout: float | None = None  # ConnectTimeout; None: the run's --connect-timeout

    @property
    def route(self) -> str:
        """How the connection gets there, for the connect check's message ('' when direct)."""
        if self.proxy_command:
            return f" through ProxyCommand {self.proxy_command!r}"
        if self.proxy_jump:
            return f" through ProxyJump {self.proxy_jump}"
        return ""


def resolve(
    target: Target, config: paramiko.SSHConfig | None, known_hosts: list[str] | None = None, hop: bool = False
) -> ConnectParams:
    """Merge, highest first: --known-hosts, the inventory (ansible_* and the options of its ssh arguments), the SSH
    configuration (the node's own -F file when its arguments name one), defaults. UnhonouredOption when the merged
    options hold one clustercheck cannot do (sshoptions.refusal), naming it, where it came from, and the node.
    HOP: TARGET is a ProxyJump hop, reached through the hops before it: its own ProxyJump and ProxyCommand are not
    followed (a `Host *` ProxyJump would otherwise lead to itself)."""
    own_file = getattr(target, "ssh_config_file", None)
    if own_file:
        config = _config_file(own_file)
    looked = _lookup(config, target.address)
    if any(k in target.ssh_options for k in _PROXIES):  # the command line's ProxyJump or ProxyCommand: the first
        looked = {k: v for k, v in looked.items() if k not in _PROXIES}
    options = {**looked, **target.ssh_options}  # -o on the command line wins over the config file, as in OpenSSH
    _refuse(target, options)
    hostname = options.get("hostname", target.address) if target.address == target.name else target.address
    if "hostname" in target.ssh_options:
        hostname = target.ssh_options["hostname"]
    port = target.port or int(options.get("port", 22))
    user = target.user or options.get("user")
    keys = [target.key_file] if target.key_file else _as_list(options.get("identityfile"))
    user_files = known_hosts or _as_list(options.get("userknownhostsfile")) or [USER_KNOWN_HOSTS]
    global_files = _as_list(options.get("globalknownhostsfile")) or [GLOBAL_KNOWN_HOSTS]
    jump = None if hop else _unless_none(options.get("proxyjump"))
    command = None if hop else _unless_none(options.get("proxycommand"))
    params = ConnectParams(
        hostname=hostname,
        port=port,
        user=user,
        key_files=[os.path.expanduser(k) for k in keys],
        user_known_hosts=[os.path.expanduser(f) for f in user_files if f != "/dev/null"],
        global_known_hosts=[os.path.expanduser(f) for f in global_files if f != "/dev/null"],
        proxy_jump=None if command else jump,
        proxy_command=proxy_command(command, hostname, port, user, target.name) if command else None,
        connect_timeout=_seconds(target, options.get("connecttimeout")),
    )
    if params.proxy_jump:
        params.jumps = [resolve(host, config, known_hosts, hop=True) for host in jump_hosts(params.proxy_jump)]
    return params


_PROXIES = ("proxycommand", "proxyjump")


def _lookup(config: paramiko.SSHConfig | None, host: str) -> dict[str, object]:
    if config is None:
        return {}
    try:
        return dict(config.lookup(host))
    except ImportError as exc:  # Match exec with Python's invoke missing (read_config refuses it first)
        raise UnhonouredOption(f"SSH config: Match exec for {host} cannot be evaluated: {exc}") from exc


def _refuse(target: Target, options: dict[str, object]) -> None:
    refused = sshoptions.refusal(options)
    if refused:
        name, value, why = refused
        where = "its ssh arguments in the inventory" if name.lower() in target.ssh_options else "the SSH config"
        raise UnhonouredOption(f"{target.name}: SSH option {name} {value} (from {where}) cannot be honoured: {why}")


def _unless_none(value: object) -> str | None:
    return None if value is None or str(value).strip().lower() in ("", "none") else str(value)


def _seconds(target: Target, value: object) -> float | None:
    if value in (None, "", "none"):
        return None
    try:
        return float(str(value))
    except ValueError as exc:
        raise UnhonouredOption(f"{target.name}: SSH option ConnectTimeout {value}: not a number of seconds") from exc


_TOKEN = re.compile(r"%(.)")


def proxy_command(command: str, hostname: str, port: int, user: str | None, original: str) -> str:
    """COMMAND with OpenSSH's ProxyCommand tokens substituted: %h the host connected to (after HostName), %p its
    port, %r the remote user (the local one when none is set), %n the host as given, %% a percent sign
    (ssh_config(5), TOKENS). Another token is an error, as in ssh."""
    values = {"h": hostname, "p": str(port), "r": user or getpass.getuser(), "n": original, "%": "%"}

    def substitute(match: re.Match[str]) -> str:
        if match[1] not in values:
            raise UnhonouredOption(f"{original}: ProxyCommand {command!r}: unknown token %{match[1]}")
        return values[match[1]]

    return _TOKEN.sub(substitute, command)


def jump_hosts(spec: str) -> list[Host]:
    """The hops of a ProxyJump, in order: each `[user@]host[:port]` or `ssh://[user@]host[:port]`."""
    hops = []
    for part in (p.strip() for p in spec.split(",")):
        text = part.removeprefix("ssh://")
        user, _, hostport = text.rpartition("@")
        if hostport.startswith("["):
            host, _, rest = hostport[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, _, port = hostport.partition(":")
        if not host or (port and not port.isdigit()):
            raise TransportError(f"ProxyJump {spec}: cannot read the hop {part!r} ([user@]host[:port])")
        hops.append(Host(name=host, address=host, port=int(port) if port else None, user=user or None))
    return hops


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
# The Match criteria paramiko evaluates (paramiko/config.py's _does_match); it takes any other as matching.
MATCH_CRITERIA = ("all", "canonical", "final", "host", "originalhost", "user", "localuser", "exec")
_configs: dict[str, paramiko.SSHConfig | None] = {}


def _config_file(path: str) -> paramiko.SSHConfig | None:
    """The file a node's `-F` names, read once per run."""
    path = os.path.expanduser(path)
    if path not in _configs:
        if not os.path.exists(path):
            raise UnhonouredOption(f"ssh -F {path}: no such file")
        _configs[path] = read_config([path])
    return _configs[path]


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
            if words and words[0].lower() == "match":
                _evaluable(path, words[1:])
            if not words or words[0].lower() != "include":
                lines.append(line.rstrip("\n"))
                continue
            for pattern in words[1:]:
                pattern = os.path.expanduser(pattern)
                for name in sorted(glob.glob(pattern if os.path.isabs(pattern) else os.path.join(base, pattern))):
                    if os.path.isfile(name):
                        lines.append(_included(name, base, depth + 1))
    return "\n".join(lines)


def _evaluable(path: str, criteria: list[str]) -> None:
    """Refuse a Match line paramiko would not evaluate as OpenSSH does (it takes an unknown criterion as matching,
    and needs Python's invoke for exec), in one line naming the criterion and the file."""
    words = list(criteria)
    while words:
        kind = words.pop(0).lstrip("!").lower()
        if kind in ("all", "canonical", "final"):
            continue
        words = words[1:]  # the criterion's argument
        if kind not in MATCH_CRITERIA:
            raise UnhonouredOption(
                f"SSH config {path}: Match {kind} cannot be evaluated by clustercheck's SSH (paramiko evaluates "
                f"{', '.join(MATCH_CRITERIA)}); write the block with those"
            )
        if kind == "exec":
            try:
                import invoke  # noqa: F401  (paramiko runs Match exec through it)
            except ImportError as exc:
                raise UnhonouredOption(
                    f"SSH config {path}: Match exec needs Python's invoke package (pip install invoke), "
                    "which paramiko runs it with"
                ) from exc
