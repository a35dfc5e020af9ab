"""Each way a command stops has its own exception, with the exit code exitcodes.py documents for it: UsageError
means a usage error (exit 4) and nothing else; no host (5), a job not started (6) and work that failed (1) are
their own outcomes, printed in the same one line with the same exit code as before."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from clustercheck import exitcodes, hosts
from clustercheck.commands import cli
from clustercheck.exitcodes import ExitCode, JobNotStarted, NoHosts, Stopped, UsageError, WorkFailed
from clustercheck.launcher.start import LaunchRequest, launch

PACKAGE = Path(exitcodes.__file__).parent


def test_a_usage_error_is_raised_with_no_other_exit_code():
    passed_a_code = [
        p.relative_to(PACKAGE)
        for p in PACKAGE.rglob("*.py")
        if re.search(r"UsageError\((?:[^()]|\([^()]*\))*ExitCode\.", p.read_text(), re.S)
    ]
    assert passed_a_code == []
    with pytest.raises(TypeError):
        UsageError("no host matched --hosts x", ExitCode.NO_HOSTS)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("outcome", "code"),
    [
        (UsageError, ExitCode.USAGE_ERROR),
        (NoHosts, ExitCode.NO_HOSTS),
        (JobNotStarted, ExitCode.NOT_STARTED),
        (WorkFailed, ExitCode.CHECK_FAILED),
    ],
)
def test_every_outcome_has_its_documented_exit_code_and_only_usage_errors_are_usage_errors(outcome, code):
    assert outcome("said").code == code
    assert issubclass(outcome, Stopped) and issubclass(outcome, UsageError) == (outcome is UsageError)


def test_no_host_matched_is_no_hosts_not_a_usage_error(monkeypatch):
    monkeypatch.setattr(hosts.inventory, "load", lambda given, limit: [])
    with pytest.raises(NoHosts, match=r"^no host matched --hosts inv\.ini --limit gpu9$") as stopped:
        hosts.load("inv.ini", "gpu9", hosts.SshOptions())
    assert not isinstance(stopped.value, UsageError)
    ran = CliRunner().invoke(cli, ["run", "--hosts", "inv.ini", "--limit", "gpu9"], prog_name="clustercheck")
    assert ran.exit_code == ExitCode.NO_HOSTS and "no host matched --hosts inv.ini --limit gpu9" in ran.output


def test_a_script_that_does_not_compile_is_a_job_not_started_and_a_missing_one_a_usage_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken.py").write_text("def f(:\n    pass\n")
    for script, outcome in (("broken.py", JobNotStarted), ("nothere.py", UsageError)):
        with pytest.raises(Stopped) as stopped:
            launch(LaunchRequest(job=(script,), hosts="localhost"), print, print)
        assert type(stopped.value) is outcome, stopped.value
