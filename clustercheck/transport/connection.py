"""One authenticated SSH connection (paramiko) to a node: host keys checked (transport.hostkeys), through one
ProxyJump hop if asked, the private key read once per run, AES-GCM asked for first, and a connection that gave no
SSH banner explained (transport.banner). The commands and copies over it are transport.ssh's."""

from __future__ import annotations

import logging
import os
import threading
import time

import paramiko

from clustercheck.transport import HostKeyError, TransportError, hostkeys
from clustercheck.transport.banner import GREETING_LINES, no_banner
from clustercheck.transport.params import ConnectParams, Timeouts, jump_host, resolve

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


class Connection:
    """One authenticated SSH connection to NAME, with host keys checked, through one ProxyJump hop if asked."""

    def __init__(
        self,
        name: str,
        params: ConnectParams,
        *,
        timeouts: Timeouts | None = None,
        accept_new_host_keys: bool = False,
        config: paramiko.SSHConfig | None = None,
    ) -> None:
        self.name = name
        self.params = params
        self.timeouts = timeouts or Timeouts()
        self.accept_new = accept_new_host_keys
        self.config = config
        self.client: paramiko.SSHClient | None = None
        self._jump: Connection | None = None

    def open(self) -> paramiko.SSHClient:
        params = self.params
        sock = self._jump_channel(params.proxy_jump) if params.proxy_jump else None
        client = paramiko.SSHClient()
        hostkeys.load(client, params)
        client.set_missing_host_key_policy(hostkeys.Policy(self.name, params, self.accept_new))
        where = f"{self.name} ({params.hostname}:{params.port})"
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
            raise
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise hostkeys.changed(self.name, params, exc) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise TransportError(
                f"{where}: authentication failed for user {params.user or os.environ.get('USER', '?')} ({exc})"
            ) from exc
        except TimeoutError as exc:
            client.close()
            raise TransportError(f"{where}: unreachable: timed out after {self.timeouts.connect:.0f} s") from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            transport = client.get_transport()
            # TCP connected, and no "SSH-2.0-..." line came: paramiko raised on reading it (the SSHException's
            # context says how the reading ended), or on sending its own banner to a connection reset already,
            # or the server's reset reached the socket before its connect() returned.
            before_banner = (
                not transport.remote_version if transport is not None else isinstance(exc, ConnectionResetError)
            )
            greeting = list(getattr(transport, "greeting", ()))
            client.close()
            if before_banner:
                how = exc.__context__ if isinstance(exc, paramiko.SSHException) else exc
                why = no_banner(how, greeting, self.timeouts.banner, time.monotonic() - started)
                raise TransportError(f"{where}: unreachable: {why}") from exc
            if isinstance(exc, paramiko.SSHException):
                raise TransportError(f"{where}: unreachable: SSH failed: {exc}") from exc
            raise TransportError(f"{where}: unreachable: {exc.strerror or exc}") from exc
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(5)
        self.client = client
        return client

    def _jump_channel(self, spec: str) -> paramiko.Channel:
        try:
            hop = jump_host(spec)
        except TransportError as exc:
            raise TransportError(f"{self.name}: {exc}") from exc
        hop_params = resolve(hop, self.config, self.params.user_known_hosts or None)
        hop_params.proxy_jump = None
        self._jump = Connection(hop.name, hop_params, timeouts=self.timeouts, accept_new_host_keys=self.accept_new)
        client = self._jump.open()
        try:
            transport = client.get_transport()
            assert transport is not None
            return transport.open_channel(
                "direct-tcpip",
                (self.params.hostname, self.params.port),
                ("127.0.0.1", 0),
                timeout=self.timeouts.connect,
            )
        except (paramiko.SSHException, OSError) as exc:
            raise TransportError(f"{self.name}: unreachable through ProxyJump {spec}: {exc}") from exc

    @property
    def active(self) -> bool:
        transport = self.client.get_transport() if self.client else None
        return transport is not None and transport.is_active()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        if self._jump is not None:
            self._jump.close()
            self._jump = None
