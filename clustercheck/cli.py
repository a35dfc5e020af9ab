"""The clustercheck command line."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console

from clustercheck import __version__, catalog, expected, inventory, report, slurm
from clustercheck.checks.baseline import DEFAULT_TOLERANCES, Baseline, ToleranceError, parse_tolerances
from clustercheck.checks.collectives import ThresholdError, parse_min_busbw
from clustercheck.checks.consistency import DEFAULT_MAX_CLOCK_OFFSET
from clustercheck.config import RunConfig
from clustercheck.container import Container
from clustercheck.exitcodes import ExitCode
from clustercheck.launcher import batch, slurmjob
from clustercheck.launcher.batch import BatchRequest
from clustercheck.model import Status, overall_status
from clustercheck.reach import Fanout
from clustercheck.remote.netprobe import DEFAULT_ROUNDS, parse_rounds
from clustercheck.report import Report, prometheus, text
from clustercheck.report import diff as report_diff
from clustercheck.run import health
from clustercheck.run.pipeline import Pipeline
from clustercheck.selection import DISTRIBUTED, STAGES, Selection, SelectionError
from clustercheck.transport import TransportError, factory, srun
from clustercheck.transport.params import SshSettings, Timeouts, load_config


class NetworkRounds(click.ParamType):
    """--network-rounds: a number of rounds (1 or more), or 'all' (None: every pair)."""

    name = "N|all"

    def convert(self, value, param, ctx) -> int | None:
        if value is None or isinstance(value, int):
            return value
        try:
            return parse_rounds(str(value))
        except argparse.ArgumentTypeError as exc:
            self.fail(str(exc), param, ctx)


SSH_CONFIG_HELP = (
    "SSH config file, read alone (default: ~/.ssh/config, then /etc/ssh/ssh_config and what it includes, as "
    "OpenSSH does)."
)


def _slurm_request_options(function):
    """What to ask Slurm for outside an allocation: run's salloc and launch's batch job take the same."""
    where = "With --slurm outside an allocation"
    for option in reversed(
        [
            click.option(
                "--nodes",
                "slurm_nodes",
                type=click.IntRange(min=1),
                default=None,
                help=f"{where}: how many nodes to ask Slurm for.",
            ),
            click.option("--nodelist", default=None, help=f"{where}: the nodes to ask for (Slurm's syntax)."),
            click.option("--partition", default=None, help=f"{where}: the partition to ask in."),
            click.option("--account", default=None, help=f"{where}: the account to charge."),
            click.option(
                "--time",
                "slurm_time",
                default=None,
                help=f"{where}: the job's time limit (Slurm's syntax, e.g. 30 or 1:00:00).",
            ),
        ]
    ):
        function = option(function)
    return function


def _container_options(function):
    """--container IMAGE and --container-option: the torch side in a container image on every node."""
    function = click.option(
        "--container-option",
        "container_options",
        multiple=True,
        metavar="OPT",
        help="With --container: a docker run option of your own, after clustercheck's (repeatable; give an option "
        "that takes a value as one word: --container-option=--shm-size=16g).",
    )(function)
    return click.option(
        "--container",
        "container_image",
        default=None,
        metavar="IMAGE",
        help="Python and torch inside IMAGE on every node: run's environment checks and torch stages, launch's job "
        "(docker run with the host's network and IPC, memlock unlimited, --gpus all on GPU nodes, as NVIDIA documents "
        "for its PyTorch images); IMAGE must be on every node already.",
    )(function)


def _container(image: str | None, options: tuple[str, ...]) -> Container | None:
    if image is None:
        if options:
            raise UsageError("--container-option: only with --container IMAGE")
        return None
    if not image.strip() or image.startswith("-") or any(c.isspace() for c in image):
        raise UsageError(f"--container {image!r}: not an image name")
    return Container(image, tuple(options))


def _slurm_request(use_slurm: bool, **asked) -> dict:
    """--nodes, --nodelist, --partition, --account, --time as given (None where not): only with --slurm, and only
    outside an allocation."""
    requested = [f"--{k}" for k, v in asked.items() if v is not None]
    if requested and not use_slurm:
        raise UsageError(f"{', '.join(requested)}: only with --slurm (an allocation to ask Slurm for)")
    inside = os.environ.get("SLURM_JOB_ID")
    if requested and inside:
        raise UsageError(f"{', '.join(requested)}: this runs inside Slurm job {inside} already")
    return asked


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="clustercheck")
def cli() -> None:
    """Prove that a cluster of GPU nodes is ready for multi-node PyTorch training."""


@cli.command()
@click.option(
    "--hosts",
    default=None,
    help="An Ansible inventory (file or directory), a comma-separated list (node1,user@node2:2222), or localhost.",
)
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@click.option(
    "--slurm",
    "use_slurm",
    is_flag=True,
    help="Reach the nodes through Slurm, not SSH: every command is a job step (srun) of the allocation this runs "
    "in (under salloc or sbatch, from the login node). The nodes are the allocation's; with --hosts, the "
    "inventory's, which must all be in it. Outside an allocation, with --nodes or --nodelist, clustercheck asks "
    "for one (salloc) and releases it at the end.",
)
@_slurm_request_options
@click.option(
    "--slurm-wait",
    type=click.IntRange(min=1),
    default=300,
    show_default=True,
    help="With --slurm outside an allocation: seconds to wait for Slurm to grant it.",
)
@click.option(
    "--python",
    "python",
    default=None,
    help="Environment python on every node (default: clustercheck_python from the inventory, else "
    "/etc/clustercheck/python on the node, else python3; on localhost, the python running clustercheck).",
)
@_container_options
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per node for the torch jobs (default: the GPU count, or 2 without GPUs).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(report.FORMAT_NAMES),
    default="text",
    show_default=True,
    help="The report: text for people, json for scripts, junit and markdown for CI, prometheus for node_exporter's "
    "textfile collector.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the report to FILE instead of stdout.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where every node's raw output is kept (default ./clustercheck-runs/<timestamp>).",
)
@click.option("--forks", type=click.IntRange(min=1), default=32, show_default=True, help="Hosts checked at once.")
@click.option("--connect-timeout", type=click.FloatRange(min=1), default=10, show_default=True, help="Seconds.")
@click.option(
    "--command-timeout",
    type=click.FloatRange(min=5),
    default=120,
    show_default=True,
    help="Deadline in seconds for the facts collector on each node.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=300,
    show_default=True,
    help="Deadline in seconds for each torch job (node-local collectives, collectives, DDP); when it passes, "
    "or a node's job fails, the job is stopped on every node.",
)
@click.option(
    "--stall-timeout",
    type=click.FloatRange(min=5),
    default=60,
    show_default=True,
    help="Seconds a node's ranks may make no progress while the others wait for them; the node is then named "
    "and the job stopped on every node.",
)
@click.option(
    "--min-busbw",
    default=None,
    metavar="FAIL[:WARN]",
    help="all_reduce bus bandwidth threshold in GB/s: FAIL under the first number, WARN under the second "
    "(default: the inventory's clustercheck_min_busbw, else report only).",
)
@click.option(
    "--dcgm-level",
    type=click.IntRange(1, 3),
    default=None,
    help="Run NVIDIA's DCGM diagnostic (dcgmi diag -r LEVEL) on every node that has dcgmi: 1 takes seconds, "
    "2 minutes, 3 up to an hour (default: off).",
)
@click.option(
    "--expect-transport",
    type=click.Choice(inventory.TRANSPORTS),
    default=None,
    help="The network NCCL must use between nodes (default: the inventory's clustercheck_expect_transport, else "
    "what each node's hardware suggests).",
)
@click.option(
    "--expected",
    "expected_file",
    default=None,
    metavar="FILE",
    help="Your own expected values per GPU model (YAML, the format of the shipped files in "
    "clustercheck/expected/): adds models or overrides their figures (default: the inventory's "
    "clustercheck_expected_file; the shipped files always apply).",
)
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(STAGES),
    help="Run only these stages (repeatable); core always collects the facts the others need.",
)
@click.option(
    "--master-port",
    type=click.IntRange(1024, 65535),
    default=29500,
    show_default=True,
    help="Rendezvous port of the torch jobs, on the first node's cluster address (loopback for the node-local job).",
)
@click.option(
    "--network-rounds",
    type=NetworkRounds(),
    default=str(DEFAULT_ROUNDS),
    show_default=True,
    metavar="N|all",
    help="Rounds of the network stage's round trip and throughput measurement: each node is measured with N "
    "partners, whatever the cluster's size; 'all' measures every pair (N-1 rounds for N nodes).",
)
@click.option(
    "--accept-new-host-keys",
    is_flag=True,
    help="Record host keys of nodes not yet in known_hosts (like StrictHostKeyChecking=accept-new); "
    "a changed key is always refused.",
)
@click.option(
    "--known-hosts",
    "known_hosts",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="known_hosts file to use instead of ~/.ssh/known_hosts (repeatable).",
)
@click.option(
    "--ssh-config",
    type=click.Path(dir_okay=False),
    default=None,
    help=SSH_CONFIG_HELP,
)
@click.option(
    "--skip",
    multiple=True,
    help=f"Skip a stage ({', '.join(DISTRIBUTED)}) or the checks whose name matches this glob, "
    "e.g. 'local.*' (repeatable).",
)
@click.option(
    "--max-clock-offset",
    type=click.FloatRange(min=0),
    default=DEFAULT_MAX_CLOCK_OFFSET,
    show_default=True,
    help="Seconds the nodes' clocks may differ.",
)
@click.option(
    "--shared-dir",
    default=None,
    metavar="PATH",
    help="A directory on a filesystem shared by every node: checked to be the same filesystem everywhere and "
    "writable, and the DDP stage's checkpoint is saved there and loaded by every rank.",
)
@click.option(
    "--data-path",
    "data_paths",
    multiple=True,
    metavar="PATH",
    help="A dataset path that must have the same content on every node (file count, total size, a hash of a "
    "sample of its files); repeatable (default: the inventory's clustercheck_data_paths).",
)
@click.option(
    "--baseline",
    "baseline_path",
    default=None,
    metavar="REPORT.json",
    help="An earlier JSON report of this cluster: this run's figures, versions and nodes are compared with it "
    "(the baseline.* checks).",
)
@click.option(
    "--baseline-tolerance",
    "baseline_tolerances",
    multiple=True,
    metavar="FIGURE=WARN[:FAIL]",
    help="How much worse than the baseline a figure may get, in percent: WARN past the first bound, FAIL past the "
    "second; FIGURE (default) is "
    + ", ".join(f"{name} ({bounds.text})" for name, bounds in DEFAULT_TOLERANCES.items())
    + " (repeatable).",
)
def run(
    hosts: str | None,
    limit: str | None,
    use_slurm: bool,
    slurm_nodes: int | None,
    nodelist: str | None,
    partition: str | None,
    account: str | None,
    slurm_time: str | None,
    slurm_wait: int,
    python: str | None,
    container_image: str | None,
    container_options: tuple[str, ...],
    nproc_per_node: int | None,
    fmt: str,
    output: str | None,
    run_dir: str | None,
    forks: int,
    connect_timeout: float,
    command_timeout: float,
    timeout: float,
    stall_timeout: float,
    master_port: int,
    network_rounds: int | None,
    accept_new_host_keys: bool,
    known_hosts: tuple[str, ...],
    ssh_config: str | None,
    skip: tuple[str, ...],
    max_clock_offset: float,
    min_busbw: str | None,
    expect_transport: str | None,
    dcgm_level: int | None,
    only: tuple[str, ...],
    shared_dir: str | None,
    data_paths: tuple[str, ...],
    baseline_path: str | None,
    baseline_tolerances: tuple[str, ...],
    expected_file: str | None,
) -> None:
    """Check every node, the consistency between them, and print a verdict."""
    tolerances = _tolerances(baseline_tolerances)
    box = _container(container_image, container_options)
    if baseline_tolerances and baseline_path is None:
        raise UsageError("--baseline-tolerance: give the report to compare with (--baseline REPORT.json)")
    baseline = Baseline(_load_report(baseline_path), baseline_path, tolerances) if baseline_path else None
    if min_busbw is not None:
        try:
            parse_min_busbw(min_busbw)
        except ThresholdError as exc:
            raise UsageError(str(exc)) from exc
    try:
        selection = Selection(only=only, skip=skip).against(entry["name"] for entry in catalog.entries())
    except SelectionError as exc:
        raise UsageError(str(exc)) from exc
    request = _slurm_request(
        use_slurm, nodes=slurm_nodes, nodelist=nodelist, partition=partition, account=account, time=slurm_time
    )
    if hosts is None and not use_slurm:
        raise UsageError("give the nodes: --hosts INVENTORY, or --slurm inside a Slurm allocation")
    if hosts is not None:
        nodes, ssh = _nodes_and_ssh(hosts, limit, ssh_config, known_hosts, accept_new_host_keys, connect_timeout)
    else:
        nodes, ssh = [], _ssh_settings(None, known_hosts, accept_new_host_keys, connect_timeout)
    job = None
    if use_slurm:
        if not os.environ.get("SLURM_JOB_ID") and (slurm_nodes or nodelist):
            job, allocated = _allocate(request, slurm_wait)
        else:
            job, allocated = _current_allocation()
        nodes = _allocation_nodes(nodes, job, allocated)
    models = _models(expected_file or next((n.expected_file for n in nodes if n.expected_file), None))
    for option, path in [("--shared-dir", shared_dir), *(("--data-path", p) for p in data_paths)]:
        if path is not None and not path.startswith("/"):
            raise UsageError(f"{option} {path}: give an absolute path (it is a path on the nodes)")
    if output and not Path(output).resolve().parent.is_dir():
        raise UsageError(f"-o {output}: no such directory {Path(output).resolve().parent}")
    run_path = _make_run_dir(run_dir, "%Y%m%d-%H%M%S")
    machine = fmt != "text"
    console = Console(stderr=machine or output is not None)
    settings = RunConfig(
        run_dir=run_path,
        selection=selection,
        python=python,
        container=box,
        forks=forks,
        command_timeout=command_timeout,
        job_timeout=timeout,
        stall_timeout=stall_timeout,
        nproc_per_node=nproc_per_node,
        master_port=master_port,
        network_rounds=network_rounds,
        ssh=ssh,
        clock_bound=max_clock_offset,
        min_busbw=min_busbw or next((n.min_busbw for n in nodes if n.min_busbw), None),
        shared_dir=shared_dir,
        data_paths=data_paths or next((n.data_paths for n in nodes if n.data_paths), ()),
        expect_transport=expect_transport,
        dcgm_level=dcgm_level,
        baseline=baseline,
        inventory=_inventory(hosts),
        models=models,
    )
    started_at = time.time()
    busy: dict[str, str] = {n.name: "waiting" for n in nodes}  # the hosts not done, in order, and their stage
    lock = threading.Lock()
    with console.status(f"checking {len(nodes)} host(s)") as status:

        def progress(host: str, stage: str) -> None:
            with lock:  # the first few hosts under way are shown: no walk over every host for each step
                if stage == "done":
                    busy.pop(host, None)
                else:
                    busy[host] = stage
                shown = "  ".join(f"{h}: {s}" for h, s in itertools.islice(busy.items(), 6))
                status.update(f"{len(nodes) - len(busy)}/{len(nodes)} host(s) done  {shown}")

        pipeline = Pipeline(nodes, settings, Fanout(_srun_factory(job) if job else factory.default(ssh)), progress)
        outcome = pipeline.run()
    results = outcome.results
    document = Report(
        results,
        [n.name for n in nodes],
        pipeline.run_id,
        started_at,
        time.time() - started_at,
        durations=outcome.durations,
        hosts_args=(
            *(("--slurm",) if use_slurm else ()),
            *(("--hosts", hosts) if hosts else ()),
            *(("--limit", limit) if limit else ()),
        ),
    )
    rendered = {kind: report.render(document, kind) for kind in ("json", "junit")}  # each rendered once
    (run_path / "report.json").write_text(rendered["json"] + "\n")
    (run_path / "report.xml").write_text(rendered["junit"] + "\n")
    if output or machine:
        asked = rendered.get(fmt) or report.render(document, fmt)
        if output:
            report.write_atomic(Path(output), asked + "\n")
        else:
            click.echo(asked)
    text.print_report(document, console, raw_output=str(run_path))
    if outcome.unclean:
        click.echo(f"clustercheck: {cleanup_message(outcome.unclean)}", err=True)
    if outcome.host_key_error:
        click.echo(
            "clustercheck: error: host key verification failed (see the connect check); nothing was run there",
            err=True,
        )
        sys.exit(ExitCode.USAGE_ERROR)
    sys.exit(ExitCode.CHECK_FAILED if overall_status(results) is Status.FAIL else ExitCode.OK)


def _inventory(hosts: str | None) -> str | None:
    """--hosts as the user gave it when it is an inventory (a file or directory), for the fix commands' -i; a
    host list or localhost is none."""
    return hosts if hosts and Path(hosts).exists() else None


def _current_allocation() -> tuple[str, str]:
    """The job id and node list of the Slurm allocation this runs in (inside salloc or sbatch)."""
    job, nodelist = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_JOB_NODELIST")
    if not job or not nodelist:
        raise UsageError(
            "--slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run it under salloc or sbatch, "
            "e.g. salloc --nodes=3 clustercheck run --slurm"
        )
    return job, nodelist


def _allocation_nodes(nodes: list, job: str, nodelist: str) -> list:
    """The nodes of Slurm job JOB (NODELIST): NODES (from --hosts) when given, which must all be in it, else every
    node of the allocation, at the address its name has here (the cluster's /etc/hosts)."""
    try:
        names = slurmjob.hostnames(nodelist)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"--slurm: {exc}") from exc
    if nodes:
        outside = [n.name for n in nodes if n.name not in names]
        if outside:
            raise UsageError(f"--slurm: {', '.join(outside)} not in Slurm job {job} ({nodelist})")
        return nodes
    found = []
    for name in names:
        try:
            found.append(inventory.Node(name, socket.gethostbyname(name)))
        except OSError as exc:
            raise UsageError(f"--slurm: node {name} of job {job} has no address here: {exc}") from exc
    return found


def _allocate(request: dict, wait: int) -> tuple[str, str]:
    """Ask Slurm for the nodes of REQUEST, waiting at most WAIT seconds: the job's id and node list. The job is
    cancelled when the command ends, however it ends (a Ctrl-C included)."""
    try:
        job = slurmjob.allocate(request, wait)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"--slurm: {exc}", ExitCode.NO_HOSTS) from exc
    click.get_current_context().call_on_close(lambda: slurmjob.release(job))
    try:
        return job, slurmjob.nodelist(job)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"--slurm: {exc}") from exc


def _srun_factory(job: str):
    try:
        return srun.factory(job)
    except TransportError as exc:
        raise UsageError(f"--slurm: {exc}") from exc


def _models(path: str | None) -> expected.Catalog:
    """The shipped expected values, with the user's file PATH added; a file that cannot be used is a usage
    error in one line."""
    try:
        return expected.shipped().with_file(path) if path else expected.shipped()
    except expected.ExpectedError as exc:
        raise UsageError(f"expected values: {exc}") from exc


def _tolerances(texts: tuple[str, ...]):
    try:
        return parse_tolerances(texts)
    except ToleranceError as exc:
        raise UsageError(str(exc)) from exc


def _load_report(path: str) -> dict:
    from clustercheck.report.load import ReportError, load

    try:
        return load(path)
    except ReportError as exc:
        raise UsageError(str(exc)) from exc


@cli.command("diff")
@click.argument("old", metavar="OLD.json")
@click.argument("new", metavar="NEW.json")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(report_diff.FORMATS),
    default="text",
    show_default=True,
    help="text for people, markdown for CI summaries and pull requests, json for scripts.",
)
@click.option(
    "--tolerance",
    "tolerances",
    multiple=True,
    metavar="FIGURE=WARN[:FAIL]",
    help="As run's --baseline-tolerance: how much worse a figure may get, in percent (repeatable).",
)
def diff_command(old: str, new: str, fmt: str, tolerances: tuple[str, ...]) -> None:
    """What changed between two JSON reports of a cluster: nodes added or gone, versions, check statuses, figures
    worse than their tolerance. Exit 1 when a figure got worse past its FAIL bound."""
    bounds = _tolerances(tolerances)
    changes = report_diff.diff(_load_report(old), _load_report(new), bounds)
    click.echo(report_diff.render(changes, fmt))
    sys.exit(ExitCode.CHECK_FAILED if changes.failed else ExitCode.OK)


def _writable_directory(option: str, value: str, *, create: bool = False) -> Path:
    """VALUE of OPTION as a directory this process can write in (made first when CREATE); a usage error in one
    line otherwise."""
    directory = Path(value)
    if create:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"{option} {value}: {exc.strerror or exc}") from None
    if not directory.is_dir():
        raise UsageError(f"{option} {value}: no such directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {value}: cannot write there")
    return directory


@cli.command("node-health")
@click.option(
    "--slurm",
    "use_slurm",
    is_flag=True,
    help="Drain this node in Slurm on a FAIL (reason 'clustercheck: CHECK: MESSAGE'); resume it when healthy "
    "if it was drained by clustercheck. The node: SLURMD_NODENAME, else the short hostname.",
)
@click.option(
    "--textfile-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help=f"Also write the results as Prometheus metrics to DIR/{health.TEXTFILE} (node_exporter's textfile "
    "directory), replaced atomically.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="text: one line per check; json: the JSON report (clustercheck schema).",
)
@click.option(
    "--expected",
    "expected_file",
    default=None,
    metavar="FILE",
    help="Your own expected values per GPU model, as run's --expected (the shipped files always apply).",
)
@click.option(
    "--torch-max-age",
    type=click.FloatRange(min=0),
    default=health.TORCH_MAX_AGE,
    show_default=True,
    metavar="SECONDS",
    help="Reuse torch's last successful import on this node (about a second each run) while it is younger than "
    "SECONDS and nothing it depends on changed (the environment's packages, torch's files, the NVIDIA driver and "
    "device files, the boot); 0 imports torch every run.",
)
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Where the last import is kept (default: /var/cache/clustercheck as root, else ~/.cache/clustercheck).",
)
def node_health(
    use_slurm: bool,
    textfile_dir: str | None,
    fmt: str,
    expected_file: str | None,
    torch_max_age: float,
    cache_dir: str | None,
) -> None:
    """Run the per-node checks on this machine, in seconds (Slurm's HealthCheckProgram). Exit 1 on a FAIL."""
    models = _models(expected_file)
    if textfile_dir is not None:
        _writable_directory("--textfile-dir", textfile_dir)
    budget = health.Budget()
    # Run as slurmd runs it, with no PATH: the probes and scontrol live in the system's directories.
    os.environ["PATH"] = health.system_path(os.environ.get("PATH"))
    name = health.node_name(os.environ)
    kept = _writable_directory("--cache-dir", cache_dir, create=True) if cache_dir is not None else None
    found = health.check(name, budget, models, torch_max_age=torch_max_age, kept=kept)
    document = found.report
    if fmt == "json":
        click.echo(report.render(document, "json"))
    else:
        judged = sorted(document.results, key=lambda r: report.SEVERITY[r.status])
        for line in text.result_lines(judged):
            click.echo(line)
        for line in text.fix_lines(judged):
            click.echo(f"fix {line}")
        click.echo(text.counts_line(document))

    if textfile_dir is not None:
        target = Path(textfile_dir) / health.TEXTFILE
        try:
            report.write_atomic(target, prometheus.render(document, source="node-health") + "\n")
        except OSError as exc:
            say(f"could not write {target}: {exc.strerror or exc}")
    if use_slurm:
        health.slurm_update(found, name, say, budget)
    sys.exit(ExitCode.CHECK_FAILED if found.failed else ExitCode.OK)


@cli.command("checks")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    show_default=True,
    help="text for people, json for scripts, markdown for documentation (the README's tables).",
)
def list_checks(fmt: str) -> None:
    """List every check clustercheck can report: its name, stage, scope, what it proves and the fix."""
    click.echo(catalog.render(fmt))


# ---------------------------------------------------------------------------------------------- launch and jobs


def _ssh_options(function):
    """The SSH options every command that reaches the nodes takes."""
    for option in reversed(
        [
            click.option(
                "--accept-new-host-keys",
                is_flag=True,
                help="Record host keys of nodes not yet in known_hosts; a changed key is always refused.",
            ),
            click.option(
                "--known-hosts",
                "known_hosts",
                multiple=True,
                type=click.Path(dir_okay=False),
                help="known_hosts file to use instead of ~/.ssh/known_hosts (repeatable).",
            ),
            click.option(
                "--ssh-config",
                type=click.Path(dir_okay=False),
                default=None,
                help=SSH_CONFIG_HELP,
            ),
            click.option(
                "--connect-timeout",
                type=click.FloatRange(min=1),
                default=10,
                show_default=True,
                help="Seconds for the TCP connection to each node.",
            ),
        ]
    ):
        function = option(function)
    return function


def _nodes_and_ssh(
    hosts: str,
    limit: str | None,
    ssh_config: str | None,
    known_hosts: tuple[str, ...],
    accept_new_host_keys: bool,
    connect_timeout: float,
) -> tuple[list, SshSettings]:
    try:
        nodes = inventory.load(hosts, limit)
    except inventory.InventoryError as exc:
        raise UsageError(str(exc)) from exc
    if not nodes:
        raise UsageError(f"no host matched --hosts {hosts}" + (f" --limit {limit}" if limit else ""), ExitCode.NO_HOSTS)
    if ssh_config and not Path(ssh_config).exists():
        raise UsageError(f"--ssh-config {ssh_config}: no such file")
    try:
        config = load_config(ssh_config) if any(not n.is_local for n in nodes) else None
    except TransportError as exc:
        raise UsageError(str(exc)) from exc
    return nodes, _ssh_settings(config, known_hosts, accept_new_host_keys, connect_timeout)


def _ssh_settings(config, known_hosts: tuple[str, ...], accept_new_host_keys: bool, connect_timeout: float):
    return SshSettings(
        timeouts=Timeouts(connect=connect_timeout, banner=connect_timeout + 5, auth=connect_timeout + 5),
        accept_new_host_keys=accept_new_host_keys,
        known_hosts=known_hosts,
        config=config,
    )


@cli.command(context_settings={"ignore_unknown_options": False})
@click.option("--hosts", default=None, help="An Ansible inventory, a comma-separated list of hosts, or localhost.")
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@click.option(
    "--slurm",
    "use_slurm",
    is_flag=True,
    help="Through Slurm, not SSH: outside an allocation, submit the launch as a batch job (--nodes or --nodelist) "
    "and follow it (--detach: print its job id); inside one (salloc, sbatch), run on its nodes with job steps.",
)
@_slurm_request_options
@click.option(
    "--dry-run",
    is_flag=True,
    help="With --slurm outside an allocation: write and print the batch script, submit nothing.",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Ranks per node (default: the node's GPU count, or 1 without GPUs).",
)
@click.option(
    "--master-port",
    type=click.IntRange(1024, 65535),
    default=29500,
    show_default=True,
    help="torchrun's --master-port on the first node (the c10d rendezvous endpoint's port in an elastic job).",
)
@click.option("--env", "env", multiple=True, metavar="K=V", help="Environment variable for every rank (repeatable).")
@click.option(
    "--sync",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Upload this local directory to every node first and run the script from the copy (the script's path "
    "is relative to it).",
)
@click.option(
    "--chdir",
    default=None,
    metavar="DIR",
    help="Working directory on every node (default: the remote user's home over SSH, the current directory on "
    "localhost; with --sync, the synced copy).",
)
@click.option("--python", default=None, help="Environment python on every node (default as for clustercheck run).")
@_container_options
@click.option("--no-preflight", is_flag=True, help="Start without the core and network checks first.")
@click.option(
    "--detach",
    is_flag=True,
    help="Run the job under a transient systemd unit on every node (with --slurm: submit the batch job) and "
    "return; see jobs, logs and stop.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where every node's output is kept (default ./clustercheck-runs/launch-<timestamp>).",
)
@_ssh_options
@click.argument(
    "job", nargs=-1, required=True, type=click.UNPROCESSED, metavar="-- [TORCHRUN OPTIONS] SCRIPT [ARGS]..."
)
def launch(
    hosts: str | None,
    limit: str | None,
    use_slurm: bool,
    slurm_nodes: int | None,
    nodelist: str | None,
    partition: str | None,
    account: str | None,
    slurm_time: str | None,
    dry_run: bool,
    nproc_per_node: int | None,
    master_port: int,
    env: tuple[str, ...],
    sync: str | None,
    chdir: str | None,
    python: str | None,
    container_image: str | None,
    container_options: tuple[str, ...],
    no_preflight: bool,
    detach: bool,
    run_dir: str | None,
    accept_new_host_keys: bool,
    known_hosts: tuple[str, ...],
    ssh_config: str | None,
    connect_timeout: float,
    job: tuple[str, ...],
) -> None:
    """Run a training script on every node under torchrun: clustercheck launch --hosts INV -- [TORCHRUN OPTIONS]
    train.py [ARGS], or as a Slurm batch job: clustercheck launch --slurm --nodes N -- train.py. The exit status is
    the job's."""
    from clustercheck.launcher import codesync, records, session
    from clustercheck.launcher import command as launch_command
    from clustercheck.launcher.job import HostKeysRefused, LaunchOptions, NotStarted
    from clustercheck.stages.launch import LaunchError

    if sync and chdir:
        raise UsageError("--sync and --chdir: the job runs in the synced copy; give one of them")
    try:
        user_command = launch_command.parse(list(job))
        user_env = launch_command.parse_env(env)
    except LaunchError as exc:
        raise UsageError(str(exc)) from exc
    box = _container(container_image, container_options)
    request = _slurm_request(
        use_slurm, nodes=slurm_nodes, nodelist=nodelist, partition=partition, account=account, time=slurm_time
    )
    inside = os.environ.get("SLURM_JOB_ID") if use_slurm else None
    if hosts is None and not use_slurm:
        raise UsageError("give the nodes: --hosts INVENTORY, or --slurm (a batch job, or the allocation this runs in)")
    if dry_run and (not use_slurm or inside):
        raise UsageError("--dry-run: only with --slurm outside an allocation (it prints the batch script)")
    if use_slurm and not inside:
        if hosts is not None:
            raise UsageError("--hosts: a batch job runs on the nodes Slurm gives it (--nodes, --nodelist)")
        if not slurm_nodes and not nodelist:
            raise UsageError(
                "--slurm: give the batch job's nodes (--nodes N or --nodelist NODES), or run inside an allocation "
                "(salloc --nodes=N clustercheck launch --slurm -- ...)"
            )
        extra = [
            *(("--nproc-per-node", str(nproc_per_node)) if nproc_per_node else ()),
            "--master-port",
            str(master_port),
            *(a for e in env for a in ("--env", e)),
            *(("--sync", str(Path(sync).resolve())) if sync else ()),
            *(("--chdir", chdir) if chdir else ()),
            *(("--python", python) if python else ()),
            *(("--container", container_image) if container_image else ()),
            *(f"--container-option={option}" for option in container_options),
            *(("--no-preflight",) if no_preflight else ()),
        ]
        _launch_batch(BatchRequest(**request), [*extra, "--", *job], run_dir, dry_run, detach)
    if use_slurm and detach:
        raise UsageError(
            f"--detach inside Slurm job {inside}: the job lives as long as this allocation; submit a batch job from "
            "the login node instead (clustercheck launch --slurm --nodes N --detach -- ...)"
        )
    if hosts is not None:
        nodes, ssh = _nodes_and_ssh(hosts, limit, ssh_config, known_hosts, accept_new_host_keys, connect_timeout)
    else:
        nodes, ssh = [], _ssh_settings(None, known_hosts, accept_new_host_keys, connect_timeout)
    if inside:
        nodes = _allocation_nodes(nodes, *_current_allocation())
    try:
        launch_command.check_nnodes(user_command, len(nodes))
        if sync and not user_command.is_module:
            codesync.sync_script(Path(sync), user_command.script)
    except LaunchError as exc:
        raise UsageError(str(exc)) from exc
    run_path = _make_run_dir(run_dir, "launch-%Y%m%d-%H%M%S")
    options = LaunchOptions(
        command=user_command,
        run_dir=run_path,
        ssh=ssh,
        python=python,
        container=box,
        nproc_per_node=nproc_per_node,
        master_port=master_port,
        env=user_env,
        sync=Path(sync) if sync else None,
        chdir=chdir,
        preflight=not no_preflight,
        detach=detach,
        inventory=_inventory(hosts),
    )

    reach = Fanout(_srun_factory(inside) if inside else factory.default(ssh))
    job_run = session.Launch(nodes, options, reach, echo=click.echo, say=say)
    try:
        try:
            if options.preflight:
                job_run.preflight()
            job_run.connect()
            script, cwd, code = job_run.prepare()
            plans = job_run.plan(script, cwd)
        except HostKeysRefused as exc:
            raise UsageError(f"host key verification failed, nothing was started: {exc}") from exc
        except NotStarted as exc:
            raise UsageError(str(exc), ExitCode.NOT_STARTED) from exc
        except LaunchError as exc:
            raise UsageError(str(exc)) from exc
        if detach:
            try:
                names = job_run.start_detached(code)
            except NotStarted as exc:
                raise UsageError(str(exc), ExitCode.NOT_STARTED) from exc
            assert hosts is not None  # --detach with --slurm is a batch job, submitted above
            hosts_ref = str(Path(hosts).resolve()) if Path(hosts).exists() else hosts
            records.save(
                records.JobRecord(
                    job=job_run.job_id,
                    hosts=hosts_ref,
                    limit=limit,
                    nodes=names,
                    command=list(job),
                    started=time.time(),
                    run_dir=str(run_path.resolve()),
                    first_ranks=launch_command.first_ranks(plans, user_command.elastic),
                    ssh_config=str(Path(ssh_config).resolve()) if ssh_config else None,
                    known_hosts=[str(Path(k).resolve()) for k in known_hosts],
                )
            )
            say(
                f"job {job_run.job_id} started on {len(names)} node(s) under systemd unit "
                f"clustercheck-job-{job_run.job_id}"
            )
            click.echo(job_run.job_id)
            say(f"follow it: clustercheck logs {job_run.job_id} --follow; stop it: clustercheck stop {job_run.job_id}")
            sys.exit(ExitCode.OK)
        finished = job_run.run_foreground()
    except KeyboardInterrupt:
        job_run.stop_all()
        raise
    finally:
        job_run.close()
    say(finished.message)
    sys.exit(finished.status)


def _launch_batch(request, launch_args: list[str], run_dir: str | None, dry_run: bool, detach: bool) -> None:
    """launch --slurm outside an allocation: write the batch script into the run directory, print it (--dry-run)
    or submit it; then print the job's id (--detach) or follow its output until it ends and exit with its status.
    Ctrl-C cancels the job."""
    from clustercheck.launcher import records
    from clustercheck.launcher.job import NotStarted

    run_path = _make_run_dir(run_dir, "launch-%Y%m%d-%H%M%S").resolve()
    path = run_path / "launch.sbatch"
    path.write_text(batch.script(request, _clustercheck_command(), launch_args, run_path, Path.cwd()))

    if dry_run:
        click.echo(path.read_text(), nl=False)
        say(f"not submitted (--dry-run); the script is {path}: submit it with sbatch {shlex.quote(str(path))}")
        sys.exit(ExitCode.OK)
    try:
        job = slurmjob.submit(path)
    except (NotStarted, slurmjob.SlurmError) as exc:
        raise UsageError(str(exc), ExitCode.NOT_STARTED) from exc
    records.save(
        records.JobRecord(
            job=job,
            hosts="",
            limit=None,
            nodes=[],
            command=launch_args[launch_args.index("--") + 1 :],
            started=time.time(),
            run_dir=str(run_path),
            slurm=True,
        )
    )
    output = batch.output_path(run_path, job)
    say(f"submitted Slurm job {job} ({path}); its output: {output}")
    if detach:
        click.echo(job)
        say(f"follow it: clustercheck logs {job} --follow; stop it: clustercheck stop {job}")
        sys.exit(ExitCode.OK)
    reader = slurmjob.OutputFile(output)
    try:
        ended = slurmjob.follow(job, reader, click.echo, say)
    except KeyboardInterrupt:
        say(f"cancelling Slurm job {job}")
        with contextlib.suppress(slurmjob.SlurmError):
            slurmjob.cancel(job)
        reader.read(click.echo, final=True)  # the launch inside, stopping every node
        raise
    except slurmjob.SlurmError as exc:
        raise UsageError(f"Slurm job {job}: {exc}", ExitCode.CHECK_FAILED) from exc
    if ended is None:
        raise UsageError(f"Slurm no longer knows job {job}: its end and status are unknown", ExitCode.CHECK_FAILED)
    status, message = ended.status()
    say(message)
    sys.exit(status)


def _clustercheck_command() -> list[str]:
    """How this clustercheck is run, for a batch script on another node of the cluster: the command's own path (the
    slurm role installs it as /usr/local/bin/clustercheck on every node), else this python's -m clustercheck."""
    here = Path(sys.argv[0])
    if here.name == "clustercheck":
        return [os.path.abspath(here) if here.parent != Path() else shutil.which("clustercheck") or "clustercheck"]
    return [sys.executable, "-m", "clustercheck"]


def _job_nodes(job: str, hosts: str | None, limit: str | None, ssh_opts: dict):
    """The nodes of JOB: from --hosts when given, else from the job's record on this machine."""
    from clustercheck.launcher import detached, records

    if not detached.JOB_ID.match(job):
        raise UsageError(f"{job}: not a job id (12 hexadecimal digits, as clustercheck launch --detach printed)")
    record = None
    if hosts is None:
        try:
            record = records.load(job)
        except records.RecordError as exc:
            raise UsageError(str(exc)) from exc
        hosts, limit = record.hosts, record.limit
        ssh_opts = {
            **ssh_opts,
            "ssh_config": ssh_opts["ssh_config"] or record.ssh_config,
            "known_hosts": ssh_opts["known_hosts"] or tuple(record.known_hosts),
        }
    nodes, ssh = _nodes_and_ssh(hosts, limit, **ssh_opts)
    if record is not None:
        nodes = [n for n in nodes if n.name in record.nodes] or nodes
    return nodes, ssh, record


def _reached(reach, say) -> None:
    for name, error in sorted(reach.errors.items()):
        say(_named({name: error}))


def _not_asked(reach, results: dict) -> dict[str, str]:
    """The nodes a jobs/logs/stop command could not ask: not reached, or the connection lost (no exit status)."""
    lost = {name: r.cause() for name, r in results.items() if r.exit_status is None}
    unanswered = {n.name: "no answer" for n in reach.nodes if n.name not in results and n.name not in reach.errors}
    return {**unanswered, **reach.errors, **lost}


def _named(errors: dict[str, str]) -> str:
    """node -> error as one clause per node; a transport's message names its node already."""
    return "; ".join(e if e.startswith(name) else f"{name}: {e}" for name, e in sorted(errors.items()))


def _unasked_error(not_asked: dict[str, str], total: int, what: str) -> UsageError:
    return UsageError(
        f"could not ask {len(not_asked)} of {total} node(s), {what}: {_named(not_asked)}", ExitCode.CHECK_FAILED
    )


@cli.command("jobs")
@click.option("--hosts", default=None, help="An Ansible inventory, a comma-separated list of hosts, or localhost.")
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@click.option(
    "--slurm",
    "use_slurm",
    is_flag=True,
    help="The launches submitted to Slurm (launch --slurm) by this user, from squeue, instead of the nodes' jobs.",
)
@click.option("--all", "show_all", is_flag=True, help="Also the jobs that ended (their output is kept on the nodes).")
@_ssh_options
def jobs_command(hosts: str | None, limit: str | None, use_slurm: bool, show_all: bool, **ssh_opts) -> None:
    """List the detached jobs on the nodes: their id, state on every node, and when they started."""
    from clustercheck.launcher import detached
    from clustercheck.launcher.connections import Connections
    from clustercheck.launcher.job import HostKeysRefused

    if use_slurm:
        if hosts is not None:
            raise UsageError("--hosts and --slurm: Slurm's jobs are listed by Slurm (squeue), give one of them")
        _slurm_jobs(show_all)
        return
    if hosts is None:
        raise UsageError("give the nodes: --hosts INVENTORY (or --slurm for the launches submitted to Slurm)")
    nodes, ssh = _nodes_and_ssh(hosts, limit, **ssh_opts)
    try:
        with Connections(nodes, Fanout(factory.default(ssh))) as reach:
            answers = reach.run(lambda name: detached.list_command())
    except HostKeysRefused as exc:
        raise UsageError(f"host key verification failed: {exc}") from exc
    not_asked = _not_asked(reach, answers)
    per_job: dict[str, dict] = {}
    for node in nodes:
        result = answers.get(node.name)
        if result is None or node.name in not_asked:
            continue
        for job in detached.parse_list(result.stdout):
            per_job.setdefault(job.job, {})[node.name] = job
    shown = 0
    for job_id, where in sorted(per_job.items(), key=lambda kv: min(j.started or 0 for j in kv[1].values())):
        if not show_all and not any(j.running for j in where.values()):
            continue
        started = min((j.started for j in where.values() if j.started), default=None)
        when = dt.datetime.fromtimestamp(started).strftime("%Y-%m-%d %H:%M:%S") if started else "?"
        states = {n.name: where.get(n.name) for n in nodes if n.name in where}
        click.echo(f"{job_id}  {when}  {detached.summary(states)}")
        shown += 1
    if not_asked:
        raise _unasked_error(not_asked, len(nodes), "so their jobs are not listed")
    if not shown:
        click.echo("no running jobs" if not show_all else "no jobs", err=True)


@cli.command("logs")
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep showing new output until the job ends on every node.")
@click.option("--hosts", default=None, help="The job's nodes (default: from the job's record on this machine).")
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@_ssh_options
def logs_command(job: str, follow: bool, hosts: str | None, limit: str | None, **ssh_opts) -> None:
    """Show a detached job's output from every node, each line prefixed with node/rank (a Slurm job's, for a Slurm
    job id)."""
    try:
        _logs(job, follow, hosts, limit, ssh_opts)
    except KeyboardInterrupt as exc:  # Ctrl-C stops the following, not the job: say so
        exc.note = f"job {job} goes on running (clustercheck stop {job} stops it)"
        raise


def _logs(job: str, follow: bool, hosts: str | None, limit: str | None, ssh_opts: dict) -> None:
    from clustercheck.launcher import detached
    from clustercheck.launcher.connections import Connections
    from clustercheck.launcher.job import HostKeysRefused

    if slurm.is_job_id(job):
        _slurm_logs(job, follow)
        return
    nodes, ssh, record = _job_nodes(job, hosts, limit, ssh_opts)
    try:
        with Connections(nodes, Fanout(factory.default(ssh))) as reach:
            _reached(reach, say)
            results = reach.stream(
                detached.logs_command(job, follow), click.echo, record.first_ranks if record else None
            )
    except HostKeysRefused as exc:
        raise UsageError(f"host key verification failed: {exc}") from exc
    not_asked = _not_asked(reach, results)
    missing = [name for name, r in results.items() if r.exit_status == 4]
    if missing and len(missing) == len(nodes):
        raise UsageError(f"no job {job} on {', '.join(missing)}")
    for name in missing:
        click.echo(f"clustercheck: no job {job} on {name}", err=True)
    if not_asked:
        raise _unasked_error(not_asked, len(nodes), "so their output is not shown")


@cli.command("stop")
@click.argument("job")
@click.option("--hosts", default=None, help="The job's nodes (default: from the job's record on this machine).")
@click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns).")
@_ssh_options
def stop_command(job: str, hosts: str | None, limit: str | None, **ssh_opts) -> None:
    """Stop a detached job on every node (SIGTERM, then SIGKILL after 15 s); its output stays on the nodes. A Slurm
    job id: the job is cancelled (scancel)."""
    from clustercheck.launcher import detached
    from clustercheck.launcher.connections import Connections
    from clustercheck.launcher.job import HostKeysRefused

    if slurm.is_job_id(job):
        _slurm_stop(job)
        return
    nodes, ssh, _ = _job_nodes(job, hosts, limit, ssh_opts)
    try:
        with Connections(nodes, Fanout(factory.default(ssh))) as reach:
            results = reach.run(lambda name: detached.stop_command(job), timeout=detached.STOP_TIMEOUT + 45)
    except HostKeysRefused as exc:
        raise UsageError(f"host key verification failed: {exc}") from exc
    not_asked = _not_asked(reach, results)
    problems = [f"{len(not_asked)} of {len(nodes)} node(s) not reached: {_named(not_asked)}"] if not_asked else []
    for name, result in results.items():
        if name in not_asked:
            continue
        if result.exit_status == 4:
            click.echo(f"{name}: no job {job}")
        elif result.ok:
            click.echo(f"{name}: {result.stdout.strip().replace('-', ' ')}")
        else:
            problems.append(f"{name}: {result.cause()}")
    if not not_asked and all(r.exit_status == 4 for r in results.values()):
        raise UsageError(f"no job {job} on any node")
    if problems:
        raise UsageError("could not stop the job everywhere: " + "; ".join(problems), ExitCode.CHECK_FAILED)


def _slurm_jobs(show_all: bool) -> None:
    """The launches this user submitted to Slurm: pending and running (--all: also those Slurm still remembers)."""
    try:
        found = slurmjob.listed(batch.JOB_NAME, show_all)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"--slurm: {exc}", ExitCode.CHECK_FAILED) from exc
    for entry in found:
        click.echo(entry.line())
    if not found:
        click.echo("no running jobs" if not show_all else "no jobs", err=True)


def _slurm_logs(job: str, follow: bool) -> None:
    """A Slurm job's output: the file scontrol names, else (once Slurm has forgotten the job) the one in the run
    directory of a launch recorded on this machine; --follow: until the job ends."""
    from clustercheck.launcher import records

    try:
        record = records.load(job)
    except records.RecordError:
        record = None
    try:
        found = slurmjob.show(job)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"Slurm job {job}: {exc}", ExitCode.CHECK_FAILED) from exc
    if found is not None and found.stdout:  # Slurm's word first: its job ids start again at 1 on a new cluster
        path = Path(found.stdout)
    elif record is not None and record.slurm:
        path = batch.output_path(Path(record.run_dir), job)
    else:
        raise UsageError(f"no job {job}: not launched from this machine, and Slurm does not know it")

    if follow and found is not None and not found.ended:
        try:
            slurmjob.follow(job, slurmjob.OutputFile(path), click.echo, say)
        except slurmjob.SlurmError as exc:
            raise UsageError(f"Slurm job {job}: {exc}", ExitCode.CHECK_FAILED) from exc
        return
    if not path.exists():
        where = f" (Slurm writes it on {found.batch_host}, the job's batch node)" if found and found.batch_host else ""
        raise UsageError(f"Slurm job {job}: its output {path} is not on this machine{where}", ExitCode.CHECK_FAILED)
    slurmjob.OutputFile(path).read(click.echo, final=True)


def _slurm_stop(job: str) -> None:
    """Stop a launch's Slurm job (slurmjob.cancel) and wait for its end; a job clustercheck did not launch is left
    alone."""
    try:
        found = slurmjob.show(job)
        if found is None:
            raise UsageError(f"no Slurm job {job}")
        if found.name != batch.JOB_NAME:
            raise UsageError(f"Slurm job {job} ({found.name}) is not a clustercheck launch: cancel it with scancel")
        if found.ended:
            raise UsageError(f"Slurm job {job} is not running ({found.state})")
        ended = slurmjob.cancel(job, seen=found)
    except slurmjob.SlurmError as exc:
        raise UsageError(f"Slurm job {job}: {exc}", ExitCode.CHECK_FAILED) from exc
    if ended is not None and not ended.ended:
        raise UsageError(
            f"Slurm job {job} still {ended.state} {slurmjob.CANCEL_WAIT:.0f} s after scancel", ExitCode.CHECK_FAILED
        )
    how = f"Slurm: {ended.state}, exit {ended.exit_code}" if ended is not None else "Slurm no longer knows it"
    click.echo(f"{job}: stopped on {found.nodes} ({how})")


@cli.command()
def schema() -> None:
    """Print the JSON Schema of the --format json report."""
    click.echo(report.schema_text(), nl=False)


def _make_run_dir(given: str | None, name: str) -> Path:
    """--run-dir (default ./clustercheck-runs/NAME, NAME a strftime pattern), made and proved writable before
    anything runs: a run directory that cannot be written is a usage error, not a failure half-way."""
    path = Path(given or Path("clustercheck-runs") / dt.datetime.now().strftime(name))
    try:
        path.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        raise UsageError(f"--run-dir {path}: cannot write there ({exc.strerror or exc})") from exc
    return path


def say(line: str) -> None:
    """clustercheck's own line on stderr (a job's output and reports go to stdout)."""
    click.echo(f"clustercheck: {line}", err=True)


class UsageError(click.ClickException):
    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE_ERROR) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def cleanup_message(unclean: dict[str, str]) -> str:
    """What the closing line says about the nodes clustercheck could not clean up."""
    if not unclean:
        return "processes started on the nodes were stopped"
    where = "; ".join(f"{node} ({why})" for node, why in sorted(unclean.items()))
    return (
        f"could not stop the processes started on {where}: they end by themselves at their deadline, and the "
        "next run stops whatever is left"
    )


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> None:
    # Ctrl-C and kill -INT/-TERM always stop the run and clean the nodes up, even when clustercheck was
    # started in the background of a script (where the shell makes it ignore SIGINT).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        cli.main(standalone_mode=False)
    except click.ClickException as exc:
        click.echo(f"clustercheck: error: {exc.format_message()}", err=True)
        code = exc.exit_code
        sys.exit(ExitCode.USAGE_ERROR if code == 2 else code)  # click's own usage errors exit 2
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        cause = exc.__cause__ if isinstance(exc, click.exceptions.Abort) else exc
        unclean = getattr(cause, "unclean", {})
        note = getattr(cause, "note", "")  # what the command wants said of the interruption
        click.echo(f"clustercheck: interrupted; {note + '; ' if note else ''}{cleanup_message(unclean)}", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug: one line, and where to report it
        click.echo(f"clustercheck: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(ExitCode.INTERNAL_ERROR)
