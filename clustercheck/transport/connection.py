"""One authenticated SSH connection (paramiko) to a node: host keys checked (transport.hostkeys), through a
ProxyCommand or the hops of a ProxyJump if asked, the private key read once per run, AES-GCM asked for first, and
a connection that gave no SSH banner explained (transport.banner). The commands and copies over it are
transport.ssh's."""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import subprocess
import tempfile
import threading
import time

import paramiko

from clustercheck.transport import HostKeyError, TransportError, hostkeys
from clustercheck.transport.banner import GREETING_LINES, no_banner
from clustercheck.transport.params import ConnectParams, Timeouts

# paramiko's transport thread logs a traceback when a connection fails (an sshd that sends no banner, a reset): with
# no handler, Python prints it to stderr. clustercheck reports every such failure itself, as one line per node.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# Asked for first, before paramiko's own order (AES-CTR with an HMAC): with those, paramiko compares every packet's
# MAC in Python, byte by byte; AES-GCM's tag is checked inside the cryptography library. OpenSSH has offered both
# since 6.2 (2013); a server that offers neither still agrees on one of paramiko's others.
PREFERRED_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


class _Transport(paramiko.Transport):
    # How often the connection's reading thread wakes while nothing arrives (paramiko's default: every 0.1 s, to
    # look at its keepalive and handshake timers). Each wake-up is an exception raised and caught in Python; with
    # hundreds of connections open through a run that was the controller's largest cost after the packets
    # themselves. Arriving data wakes it at once whatever this is; the keepalive (5 s) and the timeouts (10 s and
    # more) need no finer step.
    _active_check_timeout = 1.0

    def __init__(self, *args, **kwargs) -> None:
        self.greeting: list[str] = []  # what the server sent before an SSH banner (paramiko skips such lines)
        super().__init__(*args, **kwargs)

    def _log(self, level, msg, *args) -> None:
        # paramiko's only record of the lines it skipped while it looked for the banner: they name a refusal
        # ("Exceeded MaxStartups") or another service on the port.
        if isinstance(msg, str) and msg.startswith("Banner: ") and len(self.greeting) < GREETING_LINES:
            self.greeting.append(msg[len("Banner: ") :])
        super()._log(level, msg, *args)


def _transport(sock, **kwargs) -> paramiko.Transport:
    """The paramiko transport of a connection, with PREFERRED_CIPHERS first."""
    transport = _Transport(sock, **kwargs)
    options = transport.get_security_options()
    known = [c for c in PREFERRED_CIPHERS if c in options.ciphers]
    options.ciphers = (*known, *(c for c in options.ciphers if c not in known))
    return transport


_keys: dict[tuple[str, int, int], paramiko.PKey | None] = {}  # (path, mtime, size) -> its key; None: not loadable
_keys_lock = threading.Lock()


def _private_key(path: str) -> paramiko.PKey | None:
    """The unencrypted private key in PATH, read once per run (a run connects to every node with it; paramiko
    would read and parse the file for each connection, trying each key type in turn); None when it cannot be read
    here (encrypted, missing, another format) or when it comes with a certificate: paramiko then reads it as
    before."""
    if path.endswith("-cert.pub") or os.path.exists(path + "-cert.pub"):
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    with _keys_lock:
        if key in _keys:
            return _keys[key]
    loaded = None
    for kind in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):  # paramiko's own order
        try:
            loaded = kind.from_private_key_file(path)
            break
        except (paramiko.SSHException, OSError, ValueError):
            continue
    with _keys_lock:
        _keys[key] = loaded
    return loaded


class ProxyCommandSocket(paramiko.ProxyCommand):
    """The ProxyCommand's program as the connection's socket, run as OpenSSH runs it (`exec COMMAND` through the
    user's shell, ssh_config(5)); its stderr kept in a file (a pipe nobody reads could fill and stop it), and its
    end seen: paramiko's own reader waits for more output from a program that has exited until the timeout."""

    def __init__(self, command: str) -> None:  # paramiko's __init__ splits the line itself and runs it without a shell
        self.command = command
        self.cmd = [os.environ.get("SHELL") or "/bin/sh", "-c", f"exec {command}"]
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(
            self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, bufsize=0
        )
        self.timeout = None
        self.said: str | None = None
        self._closing = threading.Lock()  # paramiko's transport thread and the connection's owner both close it

    def recv(self, size: int) -> bytes:
        """What the program wrote, at most SIZE bytes, as a socket gives it; EOFError once it has closed its output."""
        stdout = self.process.stdout
        assert stdout is not None
        ready, _, _ = select.select([stdout], [], [], self.timeout)
        if not ready:
            raise TimeoutError()  # what paramiko waits on, as a socket's timeout
        data = os.read(stdout.fileno(), size)
        if not data:
            raise EOFError("the ProxyCommand closed its output")
        return data

    def failure(self) -> str:
        """Why the program gave no connection: its exit status and its last line on stderr (kept from when it
        was closed: paramiko closes its socket as soon as the connection fails)."""
        if self.said is None:
            try:
                status = self.process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                return "the ProxyCommand gave no SSH connection"
            if self.stderr.closed:
                return f"the ProxyCommand exited with status {status}"
            self.stderr.seek(0)
            lines = self.stderr.read().decode(errors="replace").strip().splitlines()
            said = f": {lines[-1].strip()}" if lines else ""
            self.said = f"the ProxyCommand exited with status {status}{said}"
        return self.said

    def close(self) -> None:
        """The program stopped and its stderr read (once: paramiko's transport thread closes its socket as the
        connection ends, and so does the connection's owner, at the same moment)."""
        with self._closing:
            if self.stderr.closed:
                return
            if self.process.poll() is None:
                self.process.terminate()
            if self.said is None:
                self.failure()
            try:
                self.process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.stderr.close()


class Connection:
    """One authenticated SSH connection to NAME, with host keys checked, directly, through a ProxyCommand, or
    through each hop of a ProxyJump in turn (a connection to each hop, and a direct-tcpip channel on it to the
    next), as OpenSSH makes it."""

    def __init__(
        self,
        name: str,
        params: ConnectParams,
        *,
        timeouts: Timeouts | None = None,
        accept_new_host_keys: bool = False,
        config: paramiko.SSHConfig | None = None,
        via: paramiko.Channel | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.timeouts = timeouts or Timeouts()
        if params.connect_timeout:  # the inventory's or ssh_config's ConnectTimeout for this node
            self.timeouts = dataclasses.replace(self.timeouts, connect=params.connect_timeout)
        self.accept_new = accept_new_host_keys
        self.config = config
        self.client: paramiko.SSHClient | None = None
        self._via = via  # the channel to this host on the previous hop's connection
        self._jumps: list[Connection] = []
        self._proxy: ProxyCommandSocket | None = None

    def open(self) -> paramiko.SSHClient:
        params = self.params
        sock = self._via or self._route()
        client = paramiko.SSHClient()
        hostkeys.load(client, params)
        client.set_missing_host_key_policy(hostkeys.Policy(self.name, params, self.accept_new))
        # The first key file is offered first, as paramiko would (pkey comes before key_filename), read only once.
        first = _private_key(params.key_files[0]) if params.key_files else None
        files = params.key_files[1:] if first is not None else params.key_files
        started = time.monotonic()
        try:
            client.connect(
                params.hostname,
                port=params.port,
                username=params.user,
                pkey=first,
                key_filename=files or None,
                look_for_keys=not params.key_files,
                allow_agent=True,
                timeout=self.timeouts.connect,
                banner_timeout=self.timeouts.banner,
                auth_timeout=self.timeouts.auth,
                channel_timeout=self.timeouts.auth,
                sock=sock,
                transport_factory=_transport,
            )
        except HostKeyError:
            client.close()
            self._close_route()
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            error = self._failure(client, exc, started)
            client.close()
            self._close_route()
            raise error from exc
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        self.client = client
        return client

    def _failure(self, client: paramiko.SSHClient, exc: BaseException, started: float) -> Exception:
        """What a failed connect() says, in one line naming the node, its address and the way there."""
        params = self.params
        where = f"{self.name} ({params.hostname}:{params.port}){params.route}"
        if isinstance(exc, paramiko.BadHostKeyException):
            return hostkeys.changed(self.name, params, exc)
        if isinstance(exc, paramiko.AuthenticationException):
            user = params.user or os.environ.get("USER", "?")
            return TransportError(f"{where}: authentication failed for user {user} ({exc})")
        if self._proxy is not None and self._proxy.process.poll() is not None:
            return TransportError(f"{where}: unreachable: {self._proxy.failure()}")
        if isinstance(exc, TimeoutError):
            return TransportError(f"{where}: unreachable: timed out after {self.timeouts.connect:.0f} s")
        transport = client.get_transport()
        # TCP connected, and no "SSH-2.0-..." line came: paramiko raised on reading it (the SSHException's
        # context says how the reading ended), or on sending its own banner to a connection reset already,
        # or the server's reset reached the socket before its connect() returned.
        before_banner = not transport.remote_version if transport is not None else isinstance(exc, ConnectionResetError)
        if before_banner:
            how = exc.__context__ if isinstance(exc, paramiko.SSHException) else exc
            greeting = list(getattr(transport, "greeting", ()))
            why = no_banner(how, greeting, self.timeouts.banner, time.monotonic() - started)
            return TransportError(f"{where}: unreachable: {why}")
        if isinstance(exc, paramiko.SSHException):
            return TransportError(f"{where}: unreachable: SSH failed: {exc}")
        return TransportError(f"{where}: unreachable: {getattr(exc, 'strerror', None) or exc}")

    def _route(self) -> paramiko.ProxyCommand | paramiko.Channel | None:
        """The socket to connect over: the ProxyCommand's program, the channel through the last ProxyJump hop, or
        None (paramiko connects directly)."""
        params = self.params
        if params.proxy_command:
            try:
                self._proxy = ProxyCommandSocket(params.proxy_command)
            except OSError as exc:
                raise TransportError(
                    f"{self.name}: cannot run ProxyCommand {params.proxy_command!r}: {exc.strerror or exc}"
                ) from exc
            return self._proxy
        if not params.jumps:
            return None
        via = None
        targets = [*params.jumps[1:], params]
        for hop, target in zip(params.jumps, targets, strict=True):
            connection = Connection(
                hop.hostname, hop, timeouts=self.timeouts, accept_new_host_keys=self.accept_new, via=via
            )
            try:
                client = connection.open()
                self._jumps.append(connection)
                transport = client.get_transport()
                assert transport is not None
                via = transport.open_channel(
                    "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=self.timeouts.connect
                )
            except HostKeyError:
                self._close_route()
                raise
            except (TransportError, paramiko.SSHException, OSError) as exc:
                self._close_route()
                step = f"{hop.hostname} to {target.hostname}:{target.port}"
                raise TransportError(
                    f"{self.name}: unreachable through ProxyJump {params.proxy_jump} ({step}): {exc}"
                ) from exc
        return via

    def _close_route(self) -> None:
        for jump in reversed(self._jumps):
            jump.close()
        self._jumps = []
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None

    @property
    def active(self) -> bool:
        transport = self.client.get_transport() if self.client else None
        return transport is not None and transport.is_active()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        self._close_route()
