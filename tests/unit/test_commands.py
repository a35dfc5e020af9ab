"""The command layer: what each command refuses before anything runs (in one line naming its own option), the
report's format from -o FILE's extension, the inventory's cluster-wide values read once and agreed on, and a
launch submitted to Slurm carrying every option the launch inside takes."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from clustercheck.commands import cli
from clustercheck.commands import launch as launch_command
from clustercheck.exitcodes import ExitCode, UsageError
from clustercheck.report import delivery


def invoke(*args: str, **kwargs):
    return CliRunner().invoke(cli, list(args), prog_name="clustercheck", **kwargs)


def refused(result, message: str) -> None:
    assert result.exit_code == ExitCode.USAGE_ERROR, result.output
    assert message in result.output and "Traceback" not in result.output, result.output


# ------------------------------------------------------------------------------------------ the report's format


@pytest.mark.parametrize(
    ("output", "fmt", "given", "chosen"),
    [
        ("report.json", "text", False, "json"),
        ("out/report.xml", "text", False, "junit"),
        ("summary.md", "text", False, "markdown"),
        ("clustercheck.prom", "text", False, "prometheus"),
        ("REPORT.JSON", "text", False, "json"),
        ("report.json", "json", True, "json"),
        ("report.txt", "text", False, "text"),
        ("report.txt", "markdown", True, "markdown"),
        (None, "junit", True, "junit"),
        (None, "text", False, "text"),
    ],
)
def test_a_known_extension_chooses_the_format_unless_format_says_the_same(output, fmt, given, chosen):
    assert delivery.output_format(fmt, given, output) == chosen


@pytest.mark.parametrize(("output", "fmt"), [("report.json", "text"), ("report.xml", "json"), ("a.prom", "junit")])
def test_a_format_that_contradicts_the_extension_is_a_usage_error(output, fmt):
    with pytest.raises(UsageError, match=rf"^-o {output}: a \.\w+ file holds the \w+ report, not --format {fmt}"):
        delivery.output_format(fmt, True, output)


@pytest.mark.parametrize("output", ["r.csv", "out/report.html"])
def test_an_extension_no_format_has_is_refused_without_format(output):
    with pytest.raises(UsageError, match=rf"^-o {output}: clustercheck writes no \.\w+ report: name the file .json"):
        delivery.output_format("text", False, output)
    assert delivery.output_format("json", True, output) == "json"  # --format says what the file holds


def test_a_csv_file_is_refused_before_anything_runs(tmp_path):
    result = invoke("run", "--hosts", "localhost", "-o", str(tmp_path / "r.csv"))
    refused(result, "clustercheck writes no .csv report")
    assert not (tmp_path / "r.csv").exists()


def test_text_in_a_json_file_is_refused_before_anything_runs(tmp_path):
    result = invoke("run", "--hosts", "localhost", "--format", "text", "-o", str(tmp_path / "r.json"))
    refused(result, "holds the json report, not --format text")
    assert not (tmp_path / "r.json").exists()


# --------------------------------------------------------------------------------- each command's own option


def test_only_baseline_without_a_baseline_is_a_usage_error(tmp_path):
    result = invoke("run", "--hosts", "localhost", "--only", "baseline", "--run-dir", str(tmp_path / "run"))
    refused(result, "--only baseline: the baseline stage runs only with --baseline, which was not given")
    assert not (tmp_path / "run").exists()


def test_diffs_tolerance_error_names_diffs_option(tmp_path):
    result = invoke("diff", str(tmp_path / "old.json"), str(tmp_path / "new.json"), "--tolerance", "nosuch=1")
    refused(result, "--tolerance nosuch=1: give FIGURE=WARN[:FAIL]")
    assert "--baseline-tolerance" not in result.output
    result = invoke("run", "--hosts", "localhost", "--baseline-tolerance", "nosuch=1")
    refused(result, "--baseline-tolerance nosuch=1: give FIGURE=WARN[:FAIL]")


# ---------------------------------------------------------------------------- the inventory's cluster values


def inventory(tmp_path: Path, lines: str) -> str:
    path = tmp_path / "hosts.ini"
    path.write_text(lines)
    return str(path)


def test_a_bad_min_busbw_in_the_inventory_is_a_usage_error_before_anything_runs(tmp_path):
    hosts = inventory(tmp_path, "[all]\nlocalhost ansible_connection=local\n[all:vars]\nclustercheck_min_busbw=fast\n")
    result = invoke("run", "--hosts", hosts, "--only", "core", "--run-dir", str(tmp_path / "run"))
    refused(result, "clustercheck_min_busbw (the inventory) 'fast': expected GB/s as FAIL or FAIL:WARN")
    assert not (tmp_path / "run").exists()
    given = invoke("run", "--hosts", hosts, "--min-busbw", "40:fast")  # the option's own value names the option
    refused(given, "--min-busbw '40:fast': expected GB/s")


@pytest.mark.parametrize(
    ("var", "first", "second", "said"),
    [
        ("clustercheck_data_paths", "/data/a", "/data/b", "node1: /data/a; node2: /data/b"),
        ("clustercheck_min_busbw", "40", "80", "node1: 40; node2: 80"),
        ("clustercheck_expected_file", "/etc/a.yml", "/etc/b.yml", "node1: /etc/a.yml; node2: /etc/b.yml"),
    ],
)
def test_nodes_that_set_a_cluster_value_differently_are_refused_by_name(tmp_path, var, first, second, said):
    """Not the first node's value silently: the run has one threshold, one set of data paths, one file."""
    hosts = inventory(
        tmp_path,
        f"node1 ansible_host=127.0.0.1 ansible_port=1 {var}={first}\n"
        f"node2 ansible_host=127.0.0.1 ansible_port=1 {var}={second}\n"
        "node3 ansible_host=127.0.0.1 ansible_port=1\n",
    )
    result = invoke("run", "--hosts", hosts, "--run-dir", str(tmp_path / "run"))
    refused(result, f"{var} differs between the nodes ({said}): it is one value for the whole cluster")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------- launch as a batch job

# A value for every launch option the launch inside a batch job takes; those APART one launch each, as --sync and
# --chdir exclude each other, and --spare and --no-preflight.
GIVEN = {
    "nproc_per_node": ["--nproc-per-node", "2"],
    "master_port": ["--master-port", "29611"],
    "env": ["--env", "A=x y", "--env", "B=2"],
    "python": ["--python", "/opt/env/bin/python"],
    "container_image": ["--container", "nvcr.io/nvidia/pytorch:25.01-py3"],
    "container_options": ["--container-option=--shm-size=16g", "--container-option", "--ulimit=stack=67108864"],
    "accept_new_host_keys": ["--accept-new-host-keys"],
    "known_hosts": ["--known-hosts", "kh"],
    "ssh_config": ["--ssh-config", "ssh.conf"],
    "connect_timeout": ["--connect-timeout", "7"],
}
APART = {
    "sync": ["--sync", "code"],
    "chdir": ["--chdir", "/srv/train"],
    "no_preflight": ["--no-preflight"],
    "spare": ["--spare", "1"],
}


def inner_launch(tmp_path: Path, monkeypatch, *args: str) -> list[str]:
    """The batch script's `clustercheck launch --slurm ...` line (--dry-run), as words."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    (tmp_path / "code").mkdir(exist_ok=True)
    result = invoke("launch", "--slurm", "--nodes", "2", "--dry-run", "--run-dir", str(tmp_path / "run"), *args)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.stdout.splitlines() if line.startswith("exec "))
    return shlex.split(line.replace('"$SLURM_JOB_ID"', "42"))


def test_every_option_of_a_launch_survives_into_its_batch_job(tmp_path, monkeypatch):
    outside = {p.name for p in launch_command.command.params if p.name in launch_command.OUTSIDE}
    options = {p.name for p in launch_command.command.params if isinstance(p, click.Option)} - outside
    assert options == set(GIVEN) | set(APART), "give the new launch option a value here"
    given = [a for args in GIVEN.values() for a in args]
    for apart, value in APART.items():
        words = inner_launch(tmp_path, monkeypatch, *given, *value, "--", "--max-restarts", "1", "train.py", "-x")
        assert words[-5:] == ["--", "--max-restarts", "1", "train.py", "-x"]
        inner = words[words.index("--slurm") + 3 : -5]  # after --slurm --run-dir DIR
        assert inner[:2] != ["--run-dir"] and words[words.index("--slurm") + 1] == "--run-dir"
        expected = {
            "--nproc-per-node=2",
            "--master-port=29611",
            "--env=A=x y",
            "--env=B=2",
            "--python=/opt/env/bin/python",
            "--container=nvcr.io/nvidia/pytorch:25.01-py3",
            "--container-option=--shm-size=16g",
            "--container-option=--ulimit=stack=67108864",
            "--accept-new-host-keys",
            f"--known-hosts={tmp_path / 'kh'}",
            f"--ssh-config={tmp_path / 'ssh.conf'}",
            "--connect-timeout=7.0",
            {
                "sync": f"--sync={tmp_path / 'code'}",
                "chdir": "--chdir=/srv/train",
                "no_preflight": "--no-preflight",
                "spare": "--spare=1",
            }[apart],
        }
        if apart == "spare":
            expected.add("--nodes=2")  # the job's N, which the batch job's N-to-N+K nodes hold with spares
        assert set(inner) == expected, inner
    defaults = inner_launch(tmp_path, monkeypatch, "--", "train.py")
    assert defaults[defaults.index("--slurm") + 3 :] == ["--", "train.py"]  # a default is the inside's default too


def test_a_batch_launch_with_spares_asks_slurm_for_them_too_and_the_launch_inside_leaves_them_out(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_dir = ["--dry-run", "--run-dir", str(tmp_path / "run")]
    counted = invoke("launch", "--slurm", "--nodes", "2", "--spare", "1", *run_dir, "--", "train.py")
    assert counted.exit_code == 0, counted.output
    # No Slurm here to read the partition from: N+K, said; the launch inside is told the job's N.
    assert "#SBATCH --nodes=3\n" in counted.stdout, counted.stdout
    assert " --spare=1 --nodes=2 -- train.py\n" in counted.stdout, counted.stdout
    assert "Slurm's nodes could not be read" in counted.stderr, counted.stderr
    listed = invoke("launch", "--slurm", "--nodelist", "node[1-3]", "--spare", "1", *run_dir, "--", "train.py")
    assert "#SBATCH --nodelist=node[1-3]\n" in listed.stdout and "--nodes" not in listed.stdout, listed.stdout
    refused(invoke("launch", "--hosts", "localhost", "--spare", "1", "--", "train.py"), "--spare: only with --slurm")
    assert len(invoke("launch", "--hosts", "localhost", "--spare", "1", "--", "train.py").output.splitlines()) == 1


def test_a_local_script_that_is_missing_or_does_not_compile_is_refused_before_anything_runs(tmp_path, monkeypatch):
    """launch on this machine (localhost): the script is read here at once, not on every node after the preflight
    and torchrun's start; a missing one is a usage error, one that does not compile a job not started."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "syntax_error.py").write_text("def f(:\n    pass\n")
    (tmp_path / "train.txt").write_text("not python")
    missing = invoke("launch", "--hosts", "localhost", "--", "nothere.py")
    assert missing.exit_code == ExitCode.USAGE_ERROR and f"nothere.py: no such file (in {tmp_path.resolve()})" in (
        missing.output
    )
    broken = invoke("launch", "--hosts", "localhost", "--", "syntax_error.py", "--epochs", "3")
    assert broken.exit_code == ExitCode.NOT_STARTED
    assert "syntax_error.py:1: SyntaxError: invalid syntax" in broken.output
    assert not list(tmp_path.glob("clustercheck-runs/*"))  # nothing ran, no run directory made


def test_a_module_or_a_remote_nodes_script_is_not_read_here():
    from clustercheck.launcher.command import parse, script_problem

    assert script_problem(parse(["-m", "pkg.train"]), "/nonexistent") is None
    assert script_problem(parse(["nothere.py"]), "/nonexistent")[1] is True
    assert script_problem(parse(["./run.sh"]), "/nonexistent") is None  # no .py: torchrun's to run


def test_a_launch_on_this_machine_alone_takes_a_free_port_unless_one_is_given():
    import socket

    from clustercheck.inventory import Node
    from clustercheck.launcher.start import _master_port

    local = Node("localhost", "localhost", connection="local")
    with socket.socket() as held:  # torchrun's default taken, as another run here would
        held.bind(("127.0.0.1", 0))
        chosen = _master_port(None, [local])
        assert chosen != 29500 and chosen != held.getsockname()[1]
    assert _master_port(None, [Node("node1", "10.0.0.1")]) == 29500  # other machines: torchrun's default
    assert _master_port(None, [local, Node("node1", "10.0.0.1")]) == 29500
    assert _master_port(29611, [local]) == 29611
