"""The SSH transport (paramiko): a Connection (host keys, ProxyJump, timeouts) and, on top of it, commands with
deadlines and file transfer over SFTP. Parameters come from transport.params, host-key rules from
transport.hostkeys."""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import select
import shlex
import time
from pathlib import Path

import paramiko

from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    CommandResult,
    HostKeyError,
    OutputSink,
    TransportError,
    hostkeys,
    new_run_id,
    remote_command,
    sweep_script,
    workdir_for,
)
from clustercheck.transport.params import ConnectParams, Timeouts, jump_host, resolve

# paramiko's transport thread logs a traceback when a connection fails (an sshd that sends no banner, a reset): with
# no handler, Python prints it to stderr. clustercheck reports every such failure itself, as one line per node.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


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
            raise hostkeys.changed(self.name, params, exc) from exc
        except paramiko.AuthenticationException as exc:
            client.close()
            raise TransportError(
                f"{where}: authentication failed for user {params.user or os.environ.get('USER', '?')} ({exc})"
            ) from exc
        except TimeoutError as exc:
            client.close()
            raise TransportError(f"{where}: unreachable: timed out after {self.timeouts.connect:.0f} s") from exc
        except paramiko.SSHException as exc:
            transport = client.get_transport()
            silent = transport is not None and not transport.remote_version  # TCP connected, no "SSH-2.0-..." line
            client.close()
            if silent:
                raise TransportError(
                    f"{where}: unreachable: sshd accepted the connection but sent no SSH banner within "
                    f"{self.timeouts.banner:.0f} s (sshd hung or overloaded, or no SSH server on that port)"
                ) from exc
            raise TransportError(f"{where}: unreachable: SSH failed: {exc}") from exc
        except OSError as exc:
            client.close()
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


class SSHTransport:
    """One node over SSH: every command runs with a deadline and the run marker; files move over SFTP."""

    def __init__(
        self,
        name: str,
        params: ConnectParams,
        *,
        run_id: str | None = None,
        timeouts: Timeouts | None = None,
        accept_new_host_keys: bool = False,
        config: paramiko.SSHConfig | None = None,
    ) -> None:
        self.host = name
        self.params = params
        self.run_id = run_id or new_run_id()
        self.workdir = workdir_for(self.run_id)
        self.connection = Connection(
            name,
            params,
            timeouts=timeouts,
            accept_new_host_keys=accept_new_host_keys,
            config=config,
        )
        self._sftp: paramiko.SFTPClient | None = None

    def connect(self) -> None:
        self.connection.open()

    # ------------------------------------------------------------------ commands

    def run(
        self,
        command: list[str],
        *,
        timeout: float,
        env: dict[str, str] | None = None,
        stdin: str | None = None,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        line = remote_command(command, env or {}, self.run_id, timeout, self.workdir)
        return self._exec(line, timeout, stdin, sweep_on_timeout=True, on_output=on_output)

    def _exec(
        self, line: str, timeout: float, stdin: str | None, sweep_on_timeout: bool, on_output: OutputSink | None = None
    ) -> CommandResult:
        client = self.connection.client
        transport = client.get_transport() if client else None
        if transport is None or not transport.is_active():
            return CommandResult(None, "", "connection lost")
        deadline = time.monotonic() + timeout
        try:
            channel = transport.open_session(timeout=min(timeout, self.connection.timeouts.auth))
            channel.exec_command(line)
            if stdin is not None:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
        except (paramiko.SSHException, OSError) as exc:
            return CommandResult(None, "", f"could not start the command: {exc}")
        out, err = bytearray(), bytearray()
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}

        def take(name: str, buffer: bytearray, data: bytes) -> None:
            if on_output is None:
                buffer += data
            elif data:
                on_output(name, decoders[name].decode(data))

        timed_out = False
        try:
            while True:
                busy = False
                while channel.recv_ready():
                    take("stdout", out, channel.recv(65536))
                    busy = True
                while channel.recv_stderr_ready():
                    take("stderr", err, channel.recv_stderr(65536))
                    busy = True
                if channel.exit_status_ready() and channel.eof_received:
                    while channel.recv_ready():  # what arrived together with the exit status
                        take("stdout", out, channel.recv(65536))
                    while channel.recv_stderr_ready():
                        take("stderr", err, channel.recv_stderr(65536))
                    break
                if channel.closed or not transport.is_active():
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if not busy:
                    # Sleep until output, end of output or the exit status arrives (no polling: hundreds of
                    # commands wait at once on a large cluster, and each wake-up costs the controller CPU).
                    if channel.eof_received:
                        channel.status_event.wait(0.25)
                    else:
                        select.select([channel], [], [], 0.25)
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
        script = sweep_script(self.run_id, workdir)
        return self._exec(f"sh -c {shlex.quote(script)}", CLEANUP_TIMEOUT, None, False)

    def stop(self) -> None:
        """Kill every process of this run on the node, keeping the work directory (a job's logs)."""
        self._sweep()

    # ------------------------------------------------------------------ files

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            if self.connection.client is None:
                raise TransportError(f"{self.host}: not connected")
            try:
                self._sftp = self.connection.client.open_sftp()
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

    # ------------------------------------------------------------------ ending

    def cleanup(self) -> None:
        """Kill every process of this run on the node and remove the work directory; a fresh connection is
        made when the current one is gone. Raises TransportError saying why when the node could not be cleaned."""
        if self.connection.client is None:
            return
        if not self.connection.active:
            try:
                self._close()
                self.connection.open()
            except TransportError as exc:
                raise TransportError(f"{self.host}: could not reconnect: {exc}") from exc
        try:
            result = self._sweep(self.workdir)
        except Exception as exc:
            raise TransportError(f"{self.host}: {type(exc).__name__}: {exc}") from exc
        if result.timed_out:
            raise TransportError(f"{self.host}: no answer within {CLEANUP_TIMEOUT:.0f} s")
        if not result.ok:
            raise TransportError(f"{self.host}: the cleanup failed: {result.cause()}")

    def _close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        self.connection.close()

    def close(self) -> None:
        self._close()
