"""The SSH transport (paramiko), with OpenSSH's host-key rules and ~/.ssh/config.

Host keys are checked against the user's known_hosts file (~/.ssh/known_hosts,
or UserKnownHostsFile from the inventory's ansible_ssh_common_args, from
~/.ssh/config, or --known-hosts) and the global /etc/ssh/ssh_known_hosts;
hashed entries and [host]:port entries are understood. An unknown key is
refused unless the user opts in (--accept-new-host-keys, like OpenSSH's
StrictHostKeyChecking=accept-new); a changed key is always refused.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko

from clustercheck.inventory import Node
from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    CommandResult,
    TransportError,
    new_run_id,
    remote_command,
    sweep_script,
    workdir_for,
)

USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
GLOBAL_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
_record_lock = threading.Lock()


class HostKeyError(TransportError):
    """An unknown or changed host key: the connection is refused (exit code 4)."""


@dataclass
class Timeouts:
    connect: float = 10.0  # TCP connect
    banner: float = 15.0  # the server's SSH banner after connecting
    auth: float = 15.0  # authentication


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


def resolve(
    node: Node,
    config: paramiko.SSHConfig | None,
    known_hosts: list[str] | None = None,
) -> ConnectParams:
    """Merge, highest first: --known-hosts, the inventory (ansible_* and -o options), ~/.ssh/config, defaults."""
    looked = dict(config.lookup(node.address)) if config else {}
    options = {**looked, **node.ssh_options}  # -o on the command line wins over the config file, as in OpenSSH
    hostname = options.get("hostname", node.address) if node.address == node.name else node.address
    if "hostname" in node.ssh_options:
        hostname = node.ssh_options["hostname"]
    port = node.port or int(options.get("port", 22))
    keys = [node.key_file] if node.key_file else _as_list(options.get("identityfile"))
    user_files = known_hosts or _as_list(options.get("userknownhostsfile")) or [USER_KNOWN_HOSTS]
    global_files = _as_list(options.get("globalknownhostsfile")) or [GLOBAL_KNOWN_HOSTS]
    jump = options.get("proxyjump")
    return ConnectParams(
        hostname=hostname,
        port=port,
        user=node.user or options.get("user"),
        key_files=[os.path.expanduser(k) for k in keys],
        user_known_hosts=[os.path.expanduser(f) for f in user_files if f != "/dev/null"],
        global_known_hosts=[os.path.expanduser(f) for f in global_files if f != "/dev/null"],
        proxy_jump=None if jump in (None, "none") else jump,
    )


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v) for v in value]
    return str(value).split()


def load_config(path: str | None) -> paramiko.SSHConfig | None:
    path = os.path.expanduser(path or "~/.ssh/config")
    if not os.path.exists(path):
        return None
    try:
        return paramiko.SSHConfig.from_path(path)
    except (OSError, paramiko.SSHException, ValueError) as exc:
        raise TransportError(f"cannot read SSH config {path}: {exc}") from exc


def fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def known_hosts_name(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, node: Node, params: ConnectParams, accept_new: bool) -> None:
        self.node, self.params, self.accept_new = node, params, accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        name = known_hosts_name(self.params.hostname, self.params.port)
        kind = key.get_name()
        files = " or ".join(self.params.user_known_hosts + self.params.global_known_hosts) or "no known_hosts file"
        if not self.accept_new or not self.params.user_known_hosts:
            port = f"-p {self.params.port} " if self.params.port != 22 else ""
            target = self.params.user_known_hosts[0] if self.params.user_known_hosts else USER_KNOWN_HOSTS
            raise HostKeyError(
                f"{self.node.name}: unknown host key for {name} ({kind} {fingerprint(key)}), not in {files}; "
                f"check the fingerprint on the node (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then add it "
                f"(ssh-keyscan {port}{self.params.hostname} >> {target}) or rerun with --accept-new-host-keys"
            )
        record = Path(self.params.user_known_hosts[0])
        with _record_lock:
            record.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(record, "a") as fh:
                os.fchmod(fh.fileno(), 0o600) if record.stat().st_size == 0 else None
                fh.write(f"{name} {kind} {key.get_base64()}\n")
        client.get_host_keys().add(name, kind, key)


class SSHTransport:
    """One node over SSH. Connect with connect(); every command runs with a deadline."""

    def __init__(
        self,
        node: Node,
        params: ConnectParams,
        *,
        run_id: str | None = None,
        timeouts: Timeouts | None = None,
        accept_new_host_keys: bool = False,
        config: paramiko.SSHConfig | None = None,
    ) -> None:
        self.node = node
        self.host = node.name
        self.params = params
        self.run_id = run_id or new_run_id()
        self.workdir = workdir_for(self.run_id)
        self.timeouts = timeouts or Timeouts()
        self.accept_new = accept_new_host_keys
        self.config = config
        self._client: paramiko.SSHClient | None = None
        self._jump: SSHTransport | None = None
        self._sftp: paramiko.SFTPClient | None = None

    # ------------------------------------------------------------------ connecting

    def connect(self) -> None:
        params = self.params
        sock = None
        if params.proxy_jump:
            sock = self._jump_channel(params.proxy_jump)
        client = paramiko.SSHClient()
        for path in params.global_known_hosts:
            _load_known_hosts(client, path, system=True)
        for path in params.user_known_hosts:
            _load_known_hosts(client, path, system=False)
        client.set_missing_host_key_policy(_HostKeyPolicy(self.node, params, self.accept_new))
        where = f"{self.host} ({params.hostname}:{params.port})"
        try:
            client.connect(
                params.hostname,
                port=params.port,
                username=params.user,
                key_filename=params.key_files or None,
                look_for_keys=not params.key_files,
                allow_agent=True,
                timeout=self.timeouts.connect,
                banner_timeout=self.timeouts.banner,
                auth_timeout=self.timeouts.auth,
                channel_timeout=self.timeouts.auth,
                sock=sock,
            )
        except HostKeyError:
            client.close()
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyError(
                f"{self.host}: HOST KEY CHANGED for {known_hosts_name(params.hostname, params.port)}: "
                f"the node offered {exc.key.get_name()} {fingerprint(exc.key)}, known_hosts has "
                f"{fingerprint(exc.expected_key)}; refused. If the node was reinstalled, remove the old key "
                f"(ssh-keygen -R {params.hostname}) and verify the new one"
            ) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise TransportError(
                f"{where}: authentication failed for user {params.user or os.environ.get('USER', '?')} ({exc})"
            ) from exc
        except TimeoutError as exc:
            client.close()
            raise TransportError(f"{where}: unreachable: timed out after {self.timeouts.connect:.0f} s") from exc
        except paramiko.SSHException as exc:
            client.close()
            raise TransportError(f"{where}: unreachable: SSH failed: {exc}") from exc
        except OSError as exc:
            client.close()
            raise TransportError(f"{where}: unreachable: {exc.strerror or exc}") from exc
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        self._client = client

    def _jump_channel(self, spec: str) -> paramiko.Channel:
        if "," in spec:
            raise TransportError(f"{self.host}: ProxyJump {spec}: only one jump host is supported")
        user, _, hostport = spec.rpartition("@")
        host, _, port = hostport.partition(":")
        jump_node = Node(name=host, address=host, port=int(port) if port else None, user=user or None)
        jump_params = resolve(jump_node, self.config, self.params.user_known_hosts or None)
        jump_params.proxy_jump = None
        self._jump = SSHTransport(
            jump_node, jump_params, run_id=self.run_id, timeouts=self.timeouts, accept_new_host_keys=self.accept_new
        )
        self._jump.connect()
        try:
            assert self._jump._client is not None
            jump_transport = self._jump._client.get_transport()
            assert jump_transport is not None
            return jump_transport.open_channel(
                "direct-tcpip",
                (self.params.hostname, self.params.port),
                ("127.0.0.1", 0),
                timeout=self.timeouts.connect,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise TransportError(f"{self.host}: unreachable through ProxyJump {spec}: {exc}") from exc

    # ------------------------------------------------------------------ commands

    def run(
        self, command: list[str], *, timeout: float, env: dict[str, str] | None = None, stdin: str | None = None
    ) -> CommandResult:
        return self._exec(remote_command(command, env or {}, self.run_id), timeout, stdin, sweep_on_timeout=True)

    def _exec(self, line: str, timeout: float, stdin: str | None, sweep_on_timeout: bool) -> CommandResult:
        transport = self._client.get_transport() if self._client else None
        if transport is None or not transport.is_active():
            return CommandResult(None, "", "connection lost")
        deadline = time.monotonic() + timeout
        try:
            channel = transport.open_session(timeout=min(timeout, self.timeouts.auth))
            channel.exec_command(line)
            if stdin is not None:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
        except (paramiko.SSHException, OSError) as exc:
            return CommandResult(None, "", f"could not start the command: {exc}")
        out, err = bytearray(), bytearray()
        timed_out = False
        try:
            while True:
                busy = False
                while channel.recv_ready():
                    out += channel.recv(65536)
                    busy = True
                while channel.recv_stderr_ready():
                    err += channel.recv_stderr(65536)
                    busy = True
                if channel.exit_status_ready() and channel.eof_received:
                    # Drain what arrived together with the exit status.
                    while channel.recv_ready():
                        out += channel.recv(65536)
                    while channel.recv_stderr_ready():
                        err += channel.recv_stderr(65536)
                    break
                if channel.closed or not transport.is_active():
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if not busy:
                    channel.status_event.wait(0.02)
        except BaseException:  # Ctrl-C: the caller cleans up; close the channel so nothing waits on it
            channel.close()
            raise
        status = channel.exit_status if channel.exit_status_ready() and not timed_out else None
        channel.close()
        if timed_out and sweep_on_timeout:
            self._sweep()
        text_out, text_err = out.decode(errors="replace"), err.decode(errors="replace")
        if status is None and not timed_out and not text_err:
            text_err = "the connection closed before the command reported an exit status"
        return CommandResult(status, text_out, text_err, timed_out=timed_out)

    def _sweep(self, workdir: str = "/nonexistent-clustercheck") -> CommandResult:
        return self._exec(f"sh -c {_quote(sweep_script(self.run_id, workdir))}", CLEANUP_TIMEOUT, None, False)

    def stop(self) -> None:
        """Kill every process of this run on the node, keeping the work directory (a job's logs)."""
        self._sweep()

    # ------------------------------------------------------------------ files

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            if self._client is None:
                raise TransportError(f"{self.host}: not connected")
            try:
                self._sftp = self._client.open_sftp()
            except (paramiko.SSHException, OSError) as exc:
                raise TransportError(f"{self.host}: SFTP is not available: {exc}") from exc
        return self._sftp

    def put(self, local_path: str, remote_path: str) -> None:
        sftp = self._sftp_client()
        parts = Path(remote_path).parent.parts
        for i in range(2, len(parts) + 1):
            directory = str(Path(*parts[:i]))
            try:
                sftp.stat(directory)
            except OSError:
                sftp.mkdir(directory, mode=0o700)
        try:
            sftp.put(local_path, remote_path)
        except OSError as exc:
            raise TransportError(f"{self.host}: could not copy {local_path} to {remote_path}: {exc}") from exc

    def get(self, remote_path: str, local_path: str) -> None:
        try:
            self._sftp_client().get(remote_path, local_path)
        except OSError as exc:
            raise TransportError(f"{self.host}: could not fetch {remote_path}: {exc}") from exc

    def listdir(self, remote_path: str) -> list[str]:
        try:
            return sorted(self._sftp_client().listdir(remote_path))
        except OSError:
            return []

    # ------------------------------------------------------------------ ending

    def cleanup(self) -> None:
        """Kill every process of this run on the node and remove the work directory; a fresh
        connection is made when the current one is gone."""
        if self._client is None:
            return
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            with contextlib.suppress(TransportError):
                self._close_client()
                self.connect()
        with contextlib.suppress(Exception):
            self._sweep(self.workdir)

    def _close_client(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None

    def close(self) -> None:
        self._close_client()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _load_known_hosts(client: paramiko.SSHClient, path: str, system: bool) -> None:
    if not os.path.exists(path):
        return
    try:
        if system:
            client.load_system_host_keys(path)
        else:
            client.get_host_keys().load(path)
    except (OSError, paramiko.SSHException) as exc:
        raise TransportError(f"cannot read known_hosts file {path}: {exc}") from exc
