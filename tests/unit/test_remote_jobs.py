"""The detached job's node-side scripts (clustercheck/remote/job_*.sh), run here with `sh -c` as on a node, with
id, loginctl, systemctl and systemd-run faked on PATH and HOME a temporary directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from clustercheck.launcher import detached
from clustercheck.stages import bundle

JOB = "0123456789ab"
SCRIPTS = ("job_start", "job_list", "job_logs", "job_stop", "job_discard")


def fake(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path):
    """run(argv, uid=, linger=, active=) on a fake node whose HOME is tmp_path/home; returns the process."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    home.mkdir()
    bin_dir.mkdir()

    def run(argv, uid="1000", linger="yes", active=False):
        fake(bin_dir, "id", f'[ "$1" = -u ] && echo {uid} || echo alice\n')
        fake(bin_dir, "loginctl", f"echo {linger}\n")
        said, status = ("active", 0) if active else ("inactive", 3)
        state = f'case "$*" in *--quiet*) ;; *) echo {said};; esac; exit {status}'
        fake(
            bin_dir,
            "systemctl",
            f'echo "systemctl $*" >> "$HOME/calls"\ncase "$*" in *is-active*) {state};; *MainPID*) echo 0;; esac\n',
        )
        fake(bin_dir, "systemd-run", 'echo "systemd-run $*" >> "$HOME/calls"\n')
        env = {"HOME": str(home), "PATH": f"{bin_dir}:/usr/bin:/bin"}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)

    run.home = home
    run.calls = lambda: (home / "calls").read_text() if (home / "calls").exists() else ""
    return run


def job_dir(home: Path, started: str = "1700000000") -> Path:
    directory = home / ".local/state/clustercheck/jobs" / JOB
    directory.mkdir(parents=True)
    (directory / "output.log").write_text("rank 0 says hello\n")
    (directory / "started").write_text(started + "\n")
    return directory


def test_the_scripts_are_files_of_the_node_side_package_with_the_controllers_numbers():
    texts = {name: detached.script(name) for name in SCRIPTS}
    assert f"TimeoutStopSec={detached.STOP_TIMEOUT}" in texts["job_start"]
    assert f"exit {detached.REFUSED}" in texts["job_start"]
    for name in ("job_logs", "job_stop"):
        assert f"exit {detached.NO_JOB}" in texts[name]
    for name, text in texts.items():
        assert detached.JOBS_DIR.strip('"') in text and detached.UNIT_PREFIX in text, name
        assert subprocess.run(["sh", "-n", "-c", text], capture_output=True).returncode == 0, name


def test_a_job_is_listed_with_its_state_and_a_user_without_lingering_is_told(node):
    job_dir(node.home)
    proc = node(detached.list_command(), uid="1000", linger="no")
    assert proc.returncode == 0
    assert detached.parse_list(proc.stdout) == [detached.NodeJob(JOB, "inactive", None, 1700000000.0)]
    assert "enable-linger alice" in proc.stderr
    assert f"systemctl --user is-active {detached.unit(JOB)}" in node.calls()


def test_root_lists_the_system_units_and_no_job_is_no_line(node):
    assert node(detached.list_command(), uid="0").stdout == ""
    job_dir(node.home)
    assert detached.parse_list(node(detached.list_command(), uid="0", active=True).stdout)[0].running
    assert "systemctl is-active" in node.calls() and "--user" not in node.calls()


def test_stop_stops_a_running_job_and_marks_it_stopped(node):
    directory = job_dir(node.home)
    proc = node(detached.stop_command(JOB), active=True)
    assert proc.returncode == 0 and detached.stopped(proc.stdout) == "stopped"
    assert (directory / "stopped").exists()
    assert f"systemctl --user stop {detached.unit(JOB)}" in node.calls()


def test_stop_of_a_job_not_running_or_not_there(node):
    job_dir(node.home)
    assert detached.stopped(node(detached.stop_command(JOB)).stdout) == "not running"
    missing = node(detached.stop_command("ba9876543210"))
    assert detached.no_job(missing.returncode) and "no job ba9876543210 here" in missing.stderr


def test_logs_print_the_jobs_output_and_a_missing_job_is_said(node):
    job_dir(node.home)
    for follow in (False, True):  # following a job that no longer runs prints what it wrote
        proc = node(detached.logs_command(JOB, follow))
        assert proc.returncode == 0 and proc.stdout == "rank 0 says hello\n"  # verbatim: the job's own output
    assert detached.no_job(node(detached.logs_command("ba9876543210", False)).returncode)


def test_discard_stops_the_unit_and_removes_the_jobs_directory(node):
    directory = job_dir(node.home)
    assert node(detached.discard_command(JOB)).returncode == 0
    assert not directory.exists()
    assert f"stop {detached.unit(JOB)}" in node.calls()


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is PID 1 here")
def test_start_refuses_a_node_without_systemd_as_pid_1_and_leaves_no_job(node):
    proc = node(detached.start_command(JOB, ["python", "train.py"], {"A": "1"}, None, None))
    assert proc.returncode == detached.REFUSED
    problem = detached.start_problem(proc.returncode, proc.stderr)
    assert "systemd is not running as PID 1" in problem and "without --detach" in problem
    assert not (node.home / ".local/state/clustercheck/jobs" / JOB).exists()
    assert "systemd-run" not in node.calls()


def test_a_start_without_lingering_is_refused_where_the_other_scripts_only_say_it(node):
    """job_user.sh's user_flag, as job_start.sh calls it (refuse: exit 3, detached.REFUSED) and the others do."""
    refused = node(["sh", "-c", bundle.script("job_user") + "set -e; user_flag refuse; echo started"], linger="no")
    assert refused.returncode == detached.REFUSED and "started" not in refused.stdout
    assert "sudo loginctl enable-linger alice" in detached.start_problem(refused.returncode, refused.stderr)
    told = node(["sh", "-c", bundle.script("job_user") + 'user_flag; echo "listed $uf"'], linger="no")
    assert told.returncode == 0 and told.stdout == "listed --user\n" and "enable-linger alice" in told.stderr
    assert node(["sh", "-c", bundle.script("job_user") + 'user_flag; echo "$uf"'], uid="0").stdout == "\n"
