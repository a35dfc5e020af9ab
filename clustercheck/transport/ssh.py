"""The SSH transport (paramiko): commands with deadlines and file transfer over a Connection (transport.connection:
host keys, ProxyJump, timeouts). Parameters come from transport.params, host-key rules from transport.hostkeys.

Two things real sites' sshd do are worked around here, at the one place every command and copy goes through:
- a limit on the sessions per connection (sshd_config's MaxSessions, set low by hardening profiles): when the
  server refuses one more session on a connection that has others open, that connection's limit is learnt and
  the session goes over another connection to the same node (host key verified again);
- a login shell whose startup files print text (a greeting, a module system's banner, conda's messages): sshd
  runs every command, and the SFTP subsystem, through that shell, so the text comes before the command's own
  output and SFTP fails ("Garbage packet received"). Every command first prints a marker, and what comes before
  it is the shell's, kept aside (`quirks.startup_output`); files are piped through a command (`cat`) and their
  SHA-256 checked, never over SFTP, which depends on a silent shell (and on the sftp subsystem being enabled).
"""

from __future__ import annotations

import codecs
import select
import shlex
import threading
import time
from dataclasses import dataclass

import paramiko

from clustercheck.transport import (
    CLEANUP_TIMEOUT,
    CommandResult,
    OutputSink,
    SessionQuirks,
    TransportError,
    new_run_id,
    remote_command,
    sweep_script,
    workdir_for,
)
from clustercheck.transport.connection import Connection
from clustercheck.transport.params import ConnectParams, Timeouts

# The reason code sshd gives when it refuses a session because the connection has MaxSessions open already
# (SSH2_OPEN_CONNECT_FAILED, "open failed"; RFC 4254 5.1).
OPEN_CONNECT_FAILED = 2
MAX_CONNECTIONS = 8  # connections to one node at most, when its sshd allows few sessions on each
CLOSE_LAG = 0.05  # seconds to wait before asking again for a session refused on a connection with none open
WAKE_AT_MOST = 2.0  # seconds a waiting command sleeps at most before it looks at its deadline and connection again
SHOW_MARKER = 'printf %s "$0"; printf %s "$0" >&2'  # sh -c SHOW_MARKER MARKER: the marker on stdout and stderr


@dataclass
class _Link:
    """One SSH connection of a node's transport, with the sessions open on it and the server's limit when learnt."""

    connection: Connection
    open: int = 0
    limit: int | None = None
    used: int = 0  # sessions it has carried
    established: int = 0  # sessions open on it now
    peak: int = 0  # the most it carried at once


class _AfterMarker:
    """One output stream of a command, with what the login shell printed before the command's marker set aside.

    Bytes are held back until the marker arrives; a stream that ends without it (the command never started) is
    given back whole."""

    def __init__(self, marker: bytes) -> None:
        self.marker = marker
        self.held = bytearray()
        self.found = False
        self.before = b""

    def feed(self, data: bytes) -> bytes:
        if self.found:
            return data
        self.held += data
        at = self.held.find(self.marker)
        if at < 0:
            return b""
        self.found = True
        self.before = bytes(self.held[:at])
        rest = bytes(self.held[at + len(self.marker) :])
        self.held.clear()
        return rest

    def end(self) -> bytes:
        if self.found:
            return b""
        rest = bytes(self.held)
        self.held.clear()
        return rest


class SSHTransport:
    """One node over SSH: every command runs with a deadline and the run marker; files are piped through
    commands, their checksums compared."""

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
        self.quirks = SessionQuirks()
        self.channel = "its SSH connection"
        self.connection = Connection(
            name,
            params,
            timeouts=timeouts,
            accept_new_host_keys=accept_new_host_keys,
            config=config,
        )
        self._links = [_Link(self.connection)]  # the first is self.connection; more when sshd limits sessions
        self._slots = threading.Condition()
        self._marker = f"::clustercheck-{self.run_id}::"

    def connect(self) -> None:
        self.connection.open()

    # ------------------------------------------------------------------ sessions

    def _session(self, timeout: float) -> tuple[paramiko.Channel, _Link]:
        """A new session channel, on a connection with room for one more (another connection when every one is
        at the server's limit). Raises paramiko.SSHException or OSError when none can be had."""
        deadline = time.monotonic() + timeout
        while True:
            link, new = None, False
            with self._slots:
                for candidate in self._links:
                    if candidate.connection.active and (candidate.limit is None or candidate.open < candidate.limit):
                        link = candidate
                        break
                if link is None and len(self._links) < MAX_CONNECTIONS:
                    link, new = _Link(self._another_connection()), True
                    self._links.append(link)
                if link is None:
                    if not self._slots.wait(max(0.0, deadline - time.monotonic())) or time.monotonic() > deadline:
                        raise paramiko.SSHException(
                            f"no session free on {MAX_CONNECTIONS} connections within {timeout:.0f} s "
                            "(sshd limits the sessions per connection: MaxSessions)"
                        )
                    continue
                link.open += 1
            if new:
                try:
                    link.connection.open()
                except BaseException:
                    with self._slots:
                        self._links.remove(link)
                        self._slots.notify_all()
                    raise
                self.quirks.connections = len(self._links)
            try:
                transport = link.connection.client.get_transport() if link.connection.client else None
                if transport is None or not transport.is_active():
                    raise paramiko.SSHException("connection lost")
                channel = transport.open_session(timeout=min(timeout, self.connection.timeouts.auth))
                with self._slots:
                    link.used += 1
                    link.established += 1
                    link.peak = max(link.peak, link.established)
                return channel, link
            except paramiko.SSHException as exc:
                if not _refused(exc) or not link.connection.active:
                    self._release(link)
                    raise
                with self._slots:
                    link.open -= 1
                    others = link.open
                    self._slots.notify_all()
                    if link.used or others:
                        # sshd's MaxSessions: this connection carries no more than it has open now, and never fewer
                        # than it carried at once before (a session that just ended still counts there until sshd
                        # has our close: then wait a moment and ask again).
                        floor = max(link.peak, 1)
                        link.limit = max(floor, min(link.limit or others, others))
                        self.quirks.sessions_limited = True
                        lag = others < link.limit
                    else:
                        lag = None
                if lag is None:
                    raise paramiko.SSHException(
                        f"sshd refused to open a session ({exc}), with no other open on the connection "
                        "(MaxSessions 0 in its sshd_config?)"
                    ) from exc
                if time.monotonic() > deadline:
                    raise paramiko.SSHException(
                        f"sshd kept refusing sessions for {timeout:.0f} s (MaxSessions in its sshd_config)"
                    ) from exc
                if lag:
                    time.sleep(CLOSE_LAG)
                continue
            except BaseException:
                self._release(link)
                raise

    def _another_connection(self) -> Connection:
        first = self.connection
        return Connection(
            first.name,
            first.params,
            timeouts=first.timeouts,
            accept_new_host_keys=first.accept_new,
            config=first.config,
        )

    def _release(self, link: _Link, established: bool = False) -> None:
        with self._slots:
            link.open -= 1
            link.established -= established
            self._slots.notify_all()

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
        self,
        line: str,
        timeout: float,
        stdin: str | None,
        sweep_on_timeout: bool,
        on_output: OutputSink | None = None,
    ) -> CommandResult:
        status, out, err, timed_out = self._exec_bytes(line, timeout, stdin, sweep_on_timeout, on_output)
        text_out, text_err = out.decode(errors="replace"), err.decode(errors="replace")
        if status is None and not timed_out and not text_err:
            text_err = "the connection closed before the command reported an exit status"
        return CommandResult(status, text_out, text_err, timed_out=timed_out)

    def _exec_bytes(
        self,
        line: str,
        timeout: float,
        stdin: str | None,
        sweep_on_timeout: bool,
        on_output: OutputSink | None = None,
    ) -> tuple[int | None, bytes, bytes, bool]:
        """LINE through the login shell, its output after the marker: (exit status, stdout, stderr, timed out)."""
        if not self.connection.active:
            return None, b"", b"connection lost", False
        deadline = time.monotonic() + timeout
        # Everything the login shell prints before this marker is its startup files' (see the module's doc).
        marker = self._marker
        shown = f"sh -c {shlex.quote(SHOW_MARKER)} {shlex.quote(marker)}; "
        try:
            channel, link = self._session(timeout)
        except (paramiko.SSHException, OSError, TransportError) as exc:
            return None, b"", f"could not start the command: {exc}".encode(), False
        try:
            return self._converse(channel, shown + line, deadline, stdin, sweep_on_timeout, on_output)
        finally:
            self._release(link, established=True)

    def _converse(
        self,
        channel: paramiko.Channel,
        line: str,
        deadline: float,
        stdin: str | None,
        sweep_on_timeout: bool,
        on_output: OutputSink | None,
    ) -> tuple[int | None, bytes, bytes, bool]:
        transport = channel.get_transport()
        try:
            channel.exec_command(line)
            if stdin is not None:
                channel.sendall(stdin.encode())
            channel.shutdown_write()
        except (paramiko.SSHException, OSError) as exc:
            channel.close()
            return None, b"", f"could not start the command: {exc}".encode(), False
        out, err = bytearray(), bytearray()
        decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in ("stdout", "stderr")}
        streams = {name: _AfterMarker(self._marker.encode()) for name in ("stdout", "stderr")}

        def take(name: str, buffer: bytearray, data: bytes, last: bool = False) -> None:
            data = streams[name].feed(data) + (streams[name].end() if last else b"")
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
                if channel.closed or transport is None or not transport.is_active():
                    break
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                if not busy:
                    # Sleep until output, end of output or the exit status arrives, or the deadline (no polling:
                    # hundreds of commands wait at once on a large cluster, and each wake-up costs the controller
                    # CPU). A lost connection closes the channel, which wakes the select too.
                    wait = min(WAKE_AT_MOST, max(0.0, deadline - time.monotonic()) + 0.01)
                    if channel.eof_received:
                        channel.status_event.wait(wait)
                    else:
                        select.select([channel], [], [], wait)
        except BaseException:  # Ctrl-C: the caller cleans up; close the channel so nothing waits on it
            channel.close()
            raise
        take("stdout", out, b"", last=True)
        take("stderr", err, b"", last=True)
        before = (streams["stdout"].before + streams["stderr"].before).decode(errors="replace").strip()
        if before and not self.quirks.startup_output:
            self.quirks.startup_output = before
        status = channel.exit_status if channel.exit_status_ready() and not timed_out else None
        channel.close()
        if timed_out and sweep_on_timeout:
            self._sweep()
        return status, bytes(out), bytes(err), timed_out

    def _sweep(self, workdir: str = "/nonexistent-clustercheck") -> CommandResult:
        script = sweep_script(self.run_id, workdir)
        return self._exec(f"sh -c {shlex.quote(script)}", CLEANUP_TIMEOUT, None, False)

    def stop(self) -> None:
        """Kill every process of this run on the node, keeping the work directory (a job's logs)."""
        self._sweep()

    # ------------------------------------------------------------------ files

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
        with self._slots:  # sessions still under way release their old link, not the fresh one
            extra = self._links[1:]
            self._links = [_Link(self.connection)]
            self.quirks.connections = 1
            self._slots.notify_all()
        for link in extra:
            link.connection.close()
        self.connection.close()

    def close(self) -> None:
        self._close()


def _refused(exc: paramiko.SSHException) -> bool:
    """Whether EXC is sshd refusing a session (SSH2_OPEN_CONNECT_FAILED, what MaxSessions answers). paramiko keeps
    one pending error per connection: when several sessions are refused at once, the others get its generic
    "Unable to open channel."."""
    if isinstance(exc, paramiko.ChannelException):
        return exc.code == OPEN_CONNECT_FAILED
    return str(exc) == "Unable to open channel."
