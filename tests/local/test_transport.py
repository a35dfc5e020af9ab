"""The local transport: the same contract as SSH (deadline, both streams at once, nothing left running)."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from clustercheck import transport
from clustercheck.transport import RUN_MARKER, remote_command
from clustercheck.transport.local import LocalTransport


def marked_processes(run_id: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"{RUN_MARKER}={run_id}".encode() in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_large_stdout_and_stderr_do_not_deadlock():
    transport = LocalTransport()
    script = "import sys; sys.stdout.write('o' * 5_000_000); sys.stderr.write('e' * 5_000_000)"
    result = transport.run(["python3", "-c", script], timeout=60)
    assert result.ok
    assert len(result.stdout) == len(result.stderr) == 5_000_000


def test_a_command_past_its_deadline_is_killed_with_everything_it_started():
    transport = LocalTransport()
    # The child escapes into its own session, as torchrun's workers may: the run marker still finds it.
    script = "sleep 300 & setsid sleep 301 & wait"
    started = time.monotonic()
    result = transport.run(["sh", "-c", script], timeout=1)
    assert result.timed_out and result.exit_status is None and not result.ok
    assert time.monotonic() - started < 20
    assert marked_processes(transport.run_id) == []


def test_cleanup_removes_the_work_directory():
    transport = LocalTransport()
    os.makedirs(transport.workdir)
    (Path(transport.workdir) / "f").write_text("x")
    transport.cleanup()
    assert not os.path.exists(transport.workdir)


def test_a_missing_program_is_exit_127_not_a_crash():
    result = LocalTransport().run(["/nonexistent/python", "-c", "pass"], timeout=5)
    assert result.exit_status == 127 and "No such file" in result.stderr


def test_remote_commands_are_quoted_and_marked():
    line = remote_command(["python3", "-c", "print('a b')"], {"OMP_NUM_THREADS": "1"}, "abc123")
    assert line == "env CLUSTERCHECK_RUN=abc123 OMP_NUM_THREADS=1 setsid -w python3 -c 'print('\"'\"'a b'\"'\"')'"


def test_a_remote_command_ends_by_itself_at_its_deadline_with_what_it_forked(monkeypatch):
    """The line an SSH node runs, run here: the controller is gone (nobody kills it), the command and its
    background child end at the deadline all the same."""
    monkeypatch.setattr(transport, "NODE_GRACE", 0)
    monkeypatch.setattr(transport, "KILL_AFTER", 1)
    marker = f"deadline-test-{os.getpid()}"
    line = remote_command(["sh", "-c", "sleep 120 & sleep 121; true"], {}, marker, timeout=1)
    started = time.monotonic()
    proc = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 124  # coreutils timeout: the deadline passed
    assert time.monotonic() - started < 10
    time.sleep(0.5)
    assert not marked_processes(marker)


def in_own_pid_namespace(script: str) -> str:
    """SCRIPT's output, run in a PID namespace of its own, so a sweep can never touch this machine's processes."""
    proc = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )
    return proc.stdout + proc.stderr


needs_pid_namespace = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a PID namespace"
)


@needs_pid_namespace
def test_the_startup_sweep_stops_only_other_runs_past_their_deadline(tmp_path):
    """A process of an earlier run past its deadline is stopped and named; one still within its deadline, and one
    of this run, are left alone."""
    now = int(time.time())
    script = (
        f"env {RUN_MARKER}=old {transport.UNTIL_MARKER}={now - 5} sleep 101 & "
        f"env {RUN_MARKER}=busy {transport.UNTIL_MARKER}={now + 600} sleep 102 & "
        f"env {RUN_MARKER}=mine {transport.UNTIL_MARKER}={now - 5} sleep 103 & "
        "sleep 0.5; " + transport.stale_sweep_script("mine", now, prefix=f"{tmp_path}/clustercheck-") + "; echo ---; "
        "for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = sleep ] && tr '\\0' ' ' < $p/cmdline && echo; done; "
        "kill $(jobs -p) 2>/dev/null; true"
    )
    output = in_own_pid_namespace(script)
    swept, _, alive = output.partition("---")
    processes, directories = transport.parse_stale(swept)
    assert [(f["run"], f["command"]) for f in processes] == [("old", "sleep 101")], output
    assert directories == []
    alive = sorted(line.strip() for line in alive.splitlines() if line.strip())
    assert alive == ["sleep 102", "sleep 103"]


@needs_pid_namespace
def test_the_startup_sweep_stops_a_process_without_deadline_only_when_it_is_old(tmp_path, monkeypatch):
    """Versions of clustercheck before the deadline marker left marked processes with none: they are stopped once
    older than NO_DEADLINE_AGE, never younger."""
    monkeypatch.setattr(transport, "NO_DEADLINE_AGE", 2)
    sweep = transport.stale_sweep_script("mine", prefix=f"{tmp_path}/clustercheck-")
    script = (
        f"env {RUN_MARKER}=ancient sleep 104 & sleep 3; env {RUN_MARKER}=young sleep 105 & sleep 0.3; "
        + sweep
        + "; echo ---; for p in /proc/[0-9]*; do [ \"$(cat $p/comm)\" = sleep ] && tr '\\0' ' ' < $p/cmdline && echo; "
        "done; kill $(jobs -p) 2>/dev/null; true"
    )
    output = in_own_pid_namespace(script)
    swept, _, alive = output.partition("---")
    processes, _ = transport.parse_stale(swept)
    assert [(f["run"], f["command"]) for f in processes] == [("ancient", "sleep 104")], output
    assert [line.strip() for line in alive.splitlines() if line.strip()] == ["sleep 105"]


@needs_pid_namespace
def test_the_startup_sweep_removes_an_earlier_runs_work_directory_once_nothing_of_it_runs(tmp_path):
    """A node that froze keeps its run's work directory after its processes ended at their deadline: the next run
    removes it, but never the directory of a run with a process left, or one still within its recorded deadline
    (another clustercheck running now, between two commands), or its own."""
    now = int(time.time())
    prefix = f"{tmp_path}/clustercheck-"
    for run, until in (("frozen", now - 5), ("between", now + 600), ("running", now - 5), ("mine", now - 5)):
        Path(prefix + run).mkdir()
        (Path(prefix + run) / transport.UNTIL_FILE).write_text(f"{until}\n")
    script = (
        f"env {RUN_MARKER}=running {transport.UNTIL_MARKER}={now + 600} sleep 106 & sleep 0.3; "
        + transport.stale_sweep_script("mine", now, prefix=prefix)
        + "; kill $(jobs -p) 2>/dev/null; true"
    )
    _, directories = transport.parse_stale(in_own_pid_namespace(script))
    assert directories == [{"run": "frozen", "path": prefix + "frozen"}]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "clustercheck-between",
        "clustercheck-mine",
        "clustercheck-running",
    ]


def test_every_command_with_a_deadline_records_it_in_the_work_directory(tmp_path):
    """What the next run's sweep reads: the latest deadline of the run's commands, a shorter later one never
    lowering it; nothing is created when the work directory does not exist yet."""
    workdir = tmp_path / "clustercheck-abc"
    line = remote_command(["true"], {}, "abc", timeout=5, workdir=str(workdir))
    assert subprocess.run(["sh", "-c", line], timeout=60).returncode == 0
    assert not workdir.exists()
    workdir.mkdir()
    long = remote_command(["true"], {}, "abc", timeout=500, workdir=str(workdir))
    subprocess.run(["sh", "-c", long], timeout=60, check=True)
    recorded = int((workdir / transport.UNTIL_FILE).read_text())
    assert time.time() + 500 <= recorded <= time.time() + 500 + transport.NODE_GRACE + transport.KILL_AFTER + 5
    subprocess.run(["sh", "-c", line], timeout=60, check=True)
    assert int((workdir / transport.UNTIL_FILE).read_text()) == recorded
    local = LocalTransport(run_id="abc")
    local.workdir = str(workdir)
    assert local.run(["true"], timeout=1000).ok
    assert int((workdir / transport.UNTIL_FILE).read_text()) > recorded


def test_streamed_output_arrives_while_the_command_runs_and_is_not_kept():
    transport = LocalTransport()
    seen: list[tuple[float, str, str]] = []
    script = "echo first; sleep 0.3; echo oops >&2; sleep 1; echo second"
    started = time.monotonic()
    result = transport.run(
        ["sh", "-c", script], timeout=30, on_output=lambda s, t: seen.append((time.monotonic() - started, s, t))
    )
    assert result.ok and result.stdout == result.stderr == ""
    assert [(s, t) for _, s, t in seen] == [("stdout", "first\n"), ("stderr", "oops\n"), ("stdout", "second\n")]
    assert seen[0][0] < 1.2 <= seen[2][0]  # the first line came before the command ended
    timed_out = transport.run(["sh", "-c", "echo a; sleep 30"], timeout=1, on_output=lambda s, t: None)
    assert timed_out.timed_out and marked_processes(transport.run_id) == []


# What a TCP server on loopback does with the one connection it accepts, in place of sshd's banner.
def _close(conn):
    conn.close()


def _reset(conn):
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST, not FIN
    conn.close()


def _greet(conn, line: bytes):
    conn.sendall(line)
    time.sleep(4)
    conn.close()


def _silent(conn):
    time.sleep(4)  # the kernel accepted it; nothing is ever said, as a hung sshd does
    conn.close()


CLOSED = "the server closed (or reset) the connection 0.0 s after connecting, without an SSH banner: sshd refusing"


@pytest.mark.parametrize(
    ("server", "said", "not_said"),
    [
        (_close, CLOSED, "within 2 s"),
        (_reset, CLOSED, "within 2 s"),
        (
            lambda c: _greet(c, b"220 mail.example.com ESMTP Postfix\r\n"),
            "the server on that port answered '220 mail.example.com ESMTP Postfix', not an SSH banner",
            "within 2 s",
        ),
        # OpenSSH 8.2's sshd (Ubuntu 20.04) writes this line to a connection past its MaxStartups, then closes it
        # (drop_connection; the string is in the focal test node's /usr/sbin/sshd).
        (
            lambda c: _greet(c, b"Exceeded MaxStartups\r\n"),
            "sshd refused the connection, saying 'Exceeded MaxStartups' (too many unauthenticated connections",
            "closed (or reset)",
        ),
        (_silent, "sshd accepted the connection but sent no SSH banner within 2 s (sshd hung or overloaded", "closed"),
    ],
    ids=["closes", "resets", "another-service", "maxstartups", "silent"],
)
def test_a_connection_without_an_ssh_banner_says_what_the_server_did_without_a_traceback(server, said, not_said, capfd):
    """The real paramiko transport against a server on loopback that accepts the connection and then closes it,
    resets it, greets as another service would, or never speaks: each told as what happened, and only the silent
    one as a banner timeout."""
    from clustercheck.transport.connection import Connection
    from clustercheck.transport.params import ConnectParams, Timeouts

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def accept():
            conn, _ = listener.accept()
            server(conn)

        threading.Thread(target=accept, daemon=True).start()
        params = ConnectParams("127.0.0.1", port=listener.getsockname()[1], user="nobody")
        connection = Connection("node", params, timeouts=Timeouts(connect=2, banner=2, auth=2))
        with pytest.raises(transport.TransportError) as refused:
            connection.open()
    message = str(refused.value)
    assert message.startswith(f"node (127.0.0.1:{params.port}): unreachable: "), message
    assert said in message and not_said not in message, message
    assert "Traceback" not in capfd.readouterr().err


class Altering:
    """A transport whose channel changes one character of what it carries to the node."""

    def __init__(self, inner: LocalTransport) -> None:
        self.inner, self.host = inner, inner.host

    def run(self, command, *, timeout, env=None, stdin=None, on_output=None):
        altered = stdin[:10] + ("A" if stdin[10] != "A" else "B") + stdin[11:]
        return self.inner.run(command, timeout=timeout, env=env, stdin=altered, on_output=on_output)


def test_a_file_reaches_the_node_whole_and_checked_or_not_at_all(tmp_path):
    """transport.put, the one way a file reaches a node over every transport: the node writes it from the command's
    standard input and checks its SHA-256; a copy altered on the way is refused, naming the node, and nothing of it
    is left."""
    node = LocalTransport()
    data = os.urandom(300_000)
    target = tmp_path / "made" / "code.tgz"
    transport.put(node, data, str(target))
    assert target.read_bytes() == data
    assert (target.parent.stat().st_mode & 0o777) == 0o700
    other = tmp_path / "other" / "code.tgz"
    with pytest.raises(transport.TransportError) as refused:
        transport.put(Altering(node), data, str(other))
    message = str(refused.value)
    assert message.startswith(f"{node.host}: could not copy {other} there: ") and "arrived with SHA-256" in message
    assert list(other.parent.iterdir()) == []
