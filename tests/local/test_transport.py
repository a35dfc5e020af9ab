"""The local transport: the same contract as SSH (deadline, both streams at once, nothing left running)."""

from __future__ import annotations

import os
import time
from pathlib import Path

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
