"""What real sites' sshd do to the SSH transport: a login shell that prints text before every command's output, and a
limit on the sessions per connection (MaxSessions). The transport's pieces are driven here without a network; the
fault suite puts both on a real node."""

from __future__ import annotations

import json
from pathlib import Path

import paramiko
import pytest

from clustercheck.checks import connection
from clustercheck.model import Status
from clustercheck.transport import SessionQuirks, ssh
from clustercheck.transport.params import ConnectParams

# A real exec channel's output from a Debian 12 node whose root ~/.bashrc prints a greeting on stdout and a conda-like
# line on stderr (see records/README.md).
RECORDED = json.loads((Path(__file__).parent / "records" / "ssh-startup-output.json").read_text())


def split(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 7, 29, 4096])
def test_what_the_login_shell_prints_before_the_command_is_set_aside_whatever_the_chunks(size):
    for stream, own in (("stdout", b"out\n"), ("stderr", b"err\n")):
        raw = RECORDED[stream].encode()
        after = ssh._AfterMarker(RECORDED["marker"].encode())
        got = b"".join(after.feed(chunk) for chunk in split(raw, size)) + after.end()
        assert got == own
        assert after.before == raw[: raw.index(RECORDED["marker"].encode())]


def test_a_command_whose_marker_never_came_gives_its_output_back_whole():
    after = ssh._AfterMarker(RECORDED["marker"].encode())
    said = b"Welcome to node1\nsh: 1: exec: nosuch: not found\n"
    assert after.feed(said) == b""
    assert after.end() == said


def test_a_noisy_login_shell_is_a_warning_naming_its_startup_file_and_what_breaks():
    greeting = RECORDED["stdout"].split(RECORDED["marker"])[0]
    finding = connection.session_finding(SessionQuirks(startup_output=greeting), "/bin/bash")
    assert finding.status is Status.WARN
    assert finding.message.startswith("the login shell (/bin/bash) prints text before every command's output")
    assert "~/.bashrc" in finding.message and "Welcome to node1, managed by the HPC team" in finding.message
    assert "sftp, scp and rsync fail" in finding.message
    assert "~/.bashrc" in finding.fix and "interactive" in finding.fix
    zsh = connection.session_finding(SessionQuirks(startup_output=greeting), "/usr/bin/zsh")
    assert "~/.zshenv" in zsh.message


def test_a_quiet_shell_passes_and_a_session_limit_is_named():
    assert connection.session_finding(SessionQuirks(), None).status is Status.PASS
    limited = connection.session_finding(SessionQuirks(sessions_limited=True, connections=4), None)
    assert limited.status is Status.PASS
    assert "MaxSessions" in limited.message and "4 connection(s)" in limited.message


# ----------------------------------------------------------------------------- sessions per connection


class FakeSshd:
    """An sshd that allows MAX_SESSIONS sessions per connection and refuses more as OpenSSH does
    (SSH2_OPEN_CONNECT_FAILED, "open failed")."""

    def __init__(self, max_sessions: int) -> None:
        self.max_sessions = max_sessions
        self.connections: list[FakeConnection] = []


class FakeChannel:
    def __init__(self, owner: FakeConnection) -> None:
        self.owner = owner

    def close(self) -> None:
        self.owner.sessions -= 1


class FakeConnection:
    """Stands in for transport.ssh.Connection: one authenticated connection to FakeConnection.sshd."""

    sshd: FakeSshd

    def __init__(self, name, params, *, timeouts=None, accept_new_host_keys=False, config=None) -> None:
        self.name, self.params, self.timeouts = name, params, timeouts or ssh.Timeouts()
        self.accept_new, self.config = accept_new_host_keys, config
        self.client = None
        self.sessions = 0

    def open(self):
        self.client = self
        self.sshd.connections.append(self)
        return self

    def get_transport(self):
        return self

    def is_active(self) -> bool:
        return self.client is not None

    @property
    def active(self) -> bool:
        return self.client is not None

    def open_session(self, timeout=None):
        if self.sessions >= self.sshd.max_sessions:
            raise paramiko.ChannelException(2, "open failed")
        self.sessions += 1
        return FakeChannel(self)

    def close(self) -> None:
        self.client = None


def transport_to(sshd: FakeSshd, monkeypatch) -> ssh.SSHTransport:
    FakeConnection.sshd = sshd
    monkeypatch.setattr(ssh, "Connection", FakeConnection)
    transport = ssh.SSHTransport("node2", ConnectParams(hostname="10.0.0.2"))
    transport.connect()
    return transport


def test_sessions_beyond_the_servers_limit_go_over_more_connections(monkeypatch):
    sshd = FakeSshd(max_sessions=1)
    transport = transport_to(sshd, monkeypatch)
    held = [transport._session(5) for _ in range(3)]  # three commands at once, as the core stage runs them
    assert [c.sessions for c in sshd.connections] == [1, 1, 1]
    assert transport.quirks.sessions_limited and transport.quirks.connections == 3
    for channel, link in held:
        channel.close()
        transport._release(link, established=True)
    transport._session(5)  # one at a time again: the first connection, no new one
    assert len(sshd.connections) == 3 and sshd.connections[0].sessions == 1


def test_two_sessions_per_connection_are_used_before_another_connection(monkeypatch):
    sshd = FakeSshd(max_sessions=2)
    transport = transport_to(sshd, monkeypatch)
    for _ in range(4):
        transport._session(5)
    assert [c.sessions for c in sshd.connections] == [2, 2]


def test_a_server_that_refuses_every_session_is_named(monkeypatch):
    transport = transport_to(FakeSshd(max_sessions=0), monkeypatch)
    with pytest.raises(paramiko.SSHException, match=r"sshd refused to open a session .*MaxSessions 0"):
        transport._session(5)
    answer = transport.run(["true"], timeout=5)
    assert answer.exit_status is None and "MaxSessions 0" in answer.stderr


def test_an_unlimited_server_gets_one_connection(monkeypatch):
    sshd = FakeSshd(max_sessions=10)
    transport = transport_to(sshd, monkeypatch)
    for _ in range(4):
        transport._session(5)
    assert len(sshd.connections) == 1 and not transport.quirks.sessions_limited
