"""An option is declared once: its click declaration in one place (the options several commands share in
commands/options.py), its default written once (config.py's named constants), and its field declared once, shared by
the request a command makes and the record the work is given (config.py's NodeOptions and RunOptions)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click

from clustercheck import config
from clustercheck.commands import launch, run
from clustercheck.launcher.job import LaunchOptions
from clustercheck.launcher.start import LaunchRequest
from clustercheck.run.verify import RunRequest

PACKAGE = Path(config.__file__).parent


def _sources(*, outside: str) -> dict[Path, str]:
    return {p: p.read_text() for p in PACKAGE.rglob("*.py") if outside not in p.relative_to(PACKAGE).parts}


def test_the_default_master_port_is_written_once_outside_the_node_side_programs():
    # remote/ holds the programs that must stand alone on the node: they are given the port, never read config.py.
    written = [
        p.relative_to(PACKAGE) for p, text in _sources(outside="remote").items() for _ in re.findall("29500", text)
    ]
    assert written == [Path("config.py")]


def test_the_commands_take_their_numeric_defaults_from_the_named_constants():
    # --spare's 0 (no spares) is the one number a command writes itself; every other default is a constant with
    # its reason (config.py, hosts.py, slurm/breaker.py, run/health.py).
    written = [
        (p.name, number)
        for p in (PACKAGE / "commands").glob("*.py")
        for number in re.findall(r"\bdefault=(\d[\d.]*)", p.read_text())
    ]
    assert written == [("launch.py", "0")]


def test_the_options_several_commands_take_are_declared_in_options_py_only():
    shared = "nproc-per-node|master-port|format|slurm"
    declared = {
        p.name
        for p in (PACKAGE / "commands").glob("*.py")
        if re.search(rf'click\.option\(\s*"--({shared})"', p.read_text())
    }
    assert declared == {"options.py"}


def _own(record: type, base: type) -> set[str]:
    return {f.name for f in dataclasses.fields(record)} - {f.name for f in dataclasses.fields(base)}


def test_a_field_the_request_and_the_record_share_is_declared_once_in_their_common_base():
    # What both hold under one name but resolve in between (the port chosen, the nodes' SSH settings, the run
    # directory made, the inventory's values) is declared in each; everything else they share comes from the base.
    resolved = {"run_dir", "ssh", "master_port", "min_busbw", "data_paths"}
    assert _own(RunRequest, config.RunOptions) & _own(config.RunConfig, config.RunOptions) <= resolved
    assert issubclass(RunRequest, config.RunOptions) and issubclass(config.RunConfig, config.RunOptions)
    assert _own(LaunchRequest, config.NodeOptions) & _own(LaunchOptions, config.NodeOptions) <= resolved | {
        "env",
        "sync",
        "chdir",
        "spare",
        "detach",
    }
    assert issubclass(LaunchRequest, config.NodeOptions) and issubclass(LaunchOptions, config.NodeOptions)


def _defaults(command: click.Command) -> dict[str, object]:
    return {"/".join(p.opts): p.default for p in command.params if isinstance(p, click.Option)}


def test_run_and_launch_keep_their_options_and_defaults():
    # What scripts rely on: the option names and their defaults (the constants' values, as --help shows them).
    run_defaults = _defaults(run.command)
    assert len(run_defaults) == 40 and {"--slurm", "--nodes", "--only", "--skip", "-o/--output"} <= set(run_defaults)
    assert {k: run_defaults[k] for k in ("--slurm-wait", "--forks", "--command-timeout", "--timeout")} == {
        "--slurm-wait": 300,
        "--forks": 32,
        "--command-timeout": 120,
        "--timeout": 300,
    }
    assert run_defaults["--stall-timeout"] == 60 and run_defaults["--format"] == "text"
    assert run_defaults["--connect-timeout"] == 10 and run_defaults["--network-rounds"] == "8"
    assert run_defaults["--nproc-per-node"] is None and run_defaults["--master-port"] is None
    launch_defaults = _defaults(launch.command)
    assert launch_defaults["--master-port"] is None and launch_defaults["--spare"] == 0
    assert len(launch_defaults) == 25
    assert {"--slurm", "--nproc-per-node", "--master-port", "--dry-run", "--sync", "--chdir"} <= set(launch_defaults)
    assert config.RunConfig(run_dir=Path(".")).master_port == config.DEFAULT_MASTER_PORT == 29500
