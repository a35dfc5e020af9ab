"""The options several commands take, each declared once here with its help, and turned into the settings objects
the owning packages take: the SSH options into hosts.SshOptions, the Slurm request into slurm.request.Request,
--container and --container-option into a Container, --baseline and its tolerances into a Baseline. --slurm,
--format, --nproc-per-node and --master-port are declared here with the help each command gives them (what they
mean differs a little per command); their defaults are config.py's.

Each decorator adds its options to a command; one that converts replaces the options' parameters with the object
(ssh=, request=, container=, baseline=) before the command's function is called.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

import click

from clustercheck.checks.baseline import DEFAULT_TOLERANCES, Baseline, ToleranceError, parse_tolerances
from clustercheck.container import Container
from clustercheck.exitcodes import UsageError
from clustercheck.hosts import DEFAULT_CONNECT_TIMEOUT, SshOptions
from clustercheck.slurm import allocation
from clustercheck.slurm.request import Request

HOSTS_HELP = "An Ansible inventory (file or directory), a comma-separated list (node1,user@node2:2222), or localhost."
SSH_CONFIG_HELP = (
    "SSH config file, read alone (default: ~/.ssh/config, then /etc/ssh/ssh_config and what it includes, as "
    "OpenSSH does)."
)
TOLERANCES_HELP = ", ".join(f"{name} ({bounds.text})" for name, bounds in DEFAULT_TOLERANCES.items())


def _apply(function: Callable, options: list[Callable]) -> Callable:
    """OPTIONS on FUNCTION, shown in --help in the order listed."""
    for option in reversed(options):
        function = option(function)
    return function


def slurm(help: str, name: str = "use_slurm") -> Callable:
    """--slurm, a flag (HELP: what it means for the command; NAME: the command's parameter)."""
    return click.option("--slurm", name, is_flag=True, help=help)


def output_format(formats: Sequence[str], help: str) -> Callable:
    """--format: the command's output, one of FORMATS, text unless given (fmt=)."""
    return click.option("--format", "fmt", type=click.Choice(formats), default="text", show_default=True, help=help)


def nproc_per_node(help: str) -> Callable:
    """--nproc-per-node: ranks per node of the torch jobs (None: the command's default, which HELP says)."""
    return click.option("--nproc-per-node", type=click.IntRange(min=1), default=None, help=help)


def master_port(help: str) -> Callable:
    """--master-port: the torch jobs' rendezvous port (None: the command chooses, which HELP says)."""
    return click.option("--master-port", type=click.IntRange(1024, 65535), default=None, help=help)


def hosts(help: str = HOSTS_HELP) -> Callable:
    """--hosts and --limit: the nodes (HELP: what --hosts means for the command)."""
    return lambda function: _apply(
        function,
        [
            click.option("--hosts", default=None, help=help),
            click.option("--limit", default=None, help="Only these groups or hosts (Ansible --limit patterns)."),
        ],
    )


def ssh(function: Callable) -> Callable:
    """--accept-new-host-keys, --known-hosts, --ssh-config, --connect-timeout, as one SshOptions (ssh=)."""

    @functools.wraps(function)
    def command(*args, accept_new_host_keys, known_hosts, ssh_config, connect_timeout, **kwargs):
        given = SshOptions(ssh_config, tuple(known_hosts), accept_new_host_keys, connect_timeout)
        return function(*args, ssh=given, **kwargs)

    return _apply(
        command,
        [
            click.option(
                "--accept-new-host-keys",
                is_flag=True,
                help="Record host keys of nodes not yet in known_hosts (like StrictHostKeyChecking=accept-new); "
                "a changed key is always refused.",
            ),
            click.option(
                "--known-hosts",
                "known_hosts",
                multiple=True,
                type=click.Path(dir_okay=False),
                help="known_hosts file to use instead of ~/.ssh/known_hosts (repeatable).",
            ),
            click.option("--ssh-config", type=click.Path(dir_okay=False), default=None, help=SSH_CONFIG_HELP),
            click.option(
                "--connect-timeout",
                type=click.FloatRange(min=1),
                default=DEFAULT_CONNECT_TIMEOUT,
                show_default=True,
                help="Seconds for the TCP connection to each node.",
            ),
        ],
    )


SLURM_REQUEST = ("slurm_nodes", "nodelist", "partition", "account", "slurm_time")  # the parameters slurm_request adds


def slurm_request(function: Callable) -> Callable:
    """--nodes, --nodelist, --partition, --account, --time: what to ask Slurm for outside an allocation (run's salloc,
    launch's batch job), as one Request (request=); only with the command's --slurm, and only outside an
    allocation."""
    where = "With --slurm outside an allocation"

    @functools.wraps(function)
    def command(*args, slurm_nodes, nodelist, partition, account, slurm_time, **kwargs):
        asked = Request(slurm_nodes, nodelist, partition, account, slurm_time)
        if asked.given and not kwargs["use_slurm"]:
            raise UsageError(f"{', '.join(asked.given)}: only with --slurm (an allocation to ask Slurm for)")
        inside = allocation.inside()
        # launch --spare inside an allocation takes --nodes N: how many of its nodes the job runs on (the batch job
        # of a launch --spare asks Slurm for N to N+K nodes and passes N on).
        spares_inside = kwargs.get("spare") and asked.given == ["--nodes"]
        if asked.given and inside and not spares_inside:
            raise UsageError(f"{', '.join(asked.given)}: this runs inside Slurm job {inside} already")
        return function(*args, request=asked, **kwargs)

    return _apply(
        command,
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
        ],
    )


def container(function: Callable) -> Callable:
    """--container IMAGE and --container-option: the torch side in a container image on every node, as one
    Container or None (container=)."""

    @functools.wraps(function)
    def command(*args, container_image, container_options, **kwargs):
        return function(*args, container=_container(container_image, container_options), **kwargs)

    return _apply(
        command,
        [
            click.option(
                "--container",
                "container_image",
                default=None,
                metavar="IMAGE",
                help="Python and torch inside IMAGE on every node: run's environment checks and torch stages, "
                "launch's job (docker run with the host's network and IPC, memlock unlimited, --gpus all on GPU "
                "nodes, as NVIDIA documents for its PyTorch images); IMAGE must be on every node already.",
            ),
            click.option(
                "--container-option",
                "container_options",
                multiple=True,
                metavar="OPT",
                help="With --container: a docker run option of your own, after clustercheck's (repeatable; give an "
                "option that takes a value as one word: --container-option=--shm-size=16g).",
            ),
        ],
    )


def _container(image: str | None, options: tuple[str, ...]) -> Container | None:
    if image is None:
        if options:
            raise UsageError("--container-option: only with --container IMAGE")
        return None
    if not image.strip() or image.startswith("-") or any(c.isspace() for c in image):
        raise UsageError(f"--container {image!r}: not an image name")
    return Container(image, tuple(options))


def python(function: Callable) -> Callable:
    """--python: the environment's python on every node."""
    return click.option(
        "--python",
        "python",
        default=None,
        help="Environment python on every node (default: clustercheck_python from the inventory, else "
        "/etc/clustercheck/python on the node, else python3; on localhost, the python running clustercheck).",
    )(function)


def run_dir(default: str) -> Callable:
    """--run-dir: where the command keeps every node's output (DEFAULT: the folder's name under
    ./clustercheck-runs/ when not given)."""
    return click.option(
        "--run-dir",
        type=click.Path(file_okay=False),
        default=None,
        help=f"Where every node's output is kept (default ./clustercheck-runs/{default}).",
    )


def expected(function: Callable) -> Callable:
    """--expected FILE: the user's own expected values per GPU model."""
    return click.option(
        "--expected",
        "expected_file",
        default=None,
        metavar="FILE",
        help="Your own expected values per GPU model (YAML, the format of the shipped files in "
        "clustercheck/expected/): adds models or overrides their figures; the shipped files always apply (run's "
        "default: the inventory's clustercheck_expected_file).",
    )(function)


def tolerances(texts: tuple[str, ...], option: str):
    """The baseline's tolerances from TEXTS, given with OPTION (named in the error: run's --baseline-tolerance,
    diff's --tolerance)."""
    try:
        return parse_tolerances(texts, option)
    except ToleranceError as exc:
        raise UsageError(str(exc)) from exc


def report(path: str) -> dict:
    """An earlier JSON report, read and validated (--baseline, diff's OLD.json and NEW.json)."""
    from clustercheck.report.load import ReportError, load

    try:
        return load(path)
    except ReportError as exc:
        raise UsageError(str(exc)) from exc


def baseline(function: Callable) -> Callable:
    """--baseline REPORT.json and --baseline-tolerance: the earlier report a run is compared with, read before
    anything runs, as one Baseline or None (baseline=)."""

    @functools.wraps(function)
    def command(*args, baseline_path, baseline_tolerances, **kwargs):
        bounds = tolerances(baseline_tolerances, "--baseline-tolerance")
        if baseline_tolerances and baseline_path is None:
            raise UsageError("--baseline-tolerance: give the report to compare with (--baseline REPORT.json)")
        given = Baseline(report(baseline_path), baseline_path, bounds) if baseline_path else None
        return function(*args, baseline=given, **kwargs)

    return _apply(
        command,
        [
            click.option(
                "--baseline",
                "baseline_path",
                default=None,
                metavar="REPORT.json",
                help="An earlier JSON report of this cluster: this run's figures, versions and nodes are compared "
                "with it (the baseline.* checks).",
            ),
            click.option(
                "--baseline-tolerance",
                "baseline_tolerances",
                multiple=True,
                metavar="FIGURE=WARN[:FAIL]",
                help="How much worse than the baseline a figure may get, in percent: WARN past the first bound, FAIL "
                f"past the second; FIGURE (default) is {TOLERANCES_HELP} (repeatable).",
            ),
        ],
    )


BURN_LENGTH = re.compile(r"(\d+(?:\.\d+)?)([smh]?)")
BURN_BOUNDS = (10.0, 24 * 3600.0)  # seconds a burn may last: long enough to heat the GPUs, at most a day


def burn_seconds(text: str | None) -> float | None:
    """--burn LENGTH in seconds (90s, 10m, 1h; a bare number is seconds), None without it; a bad one is a usage
    error in one line."""
    if text is None:
        return None
    match = BURN_LENGTH.fullmatch(text.strip().lower())
    if not match:
        raise UsageError(f"--burn {text}: give a length such as 90s, 10m or 1h")
    seconds = float(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]
    low, high = BURN_BOUNDS
    if not low <= seconds <= high:
        raise UsageError(f"--burn {text}: give a length from {low:.0f}s to {high / 3600:.0f}h")
    return seconds


def burn(function: Callable) -> Callable:
    """--burn LENGTH: every GPU under load for LENGTH, watched (the gpu.burn.* checks), as seconds or None
    (burn_seconds=)."""

    @functools.wraps(function)
    def command(*args, burn_length, **kwargs):
        return function(*args, burn_seconds=burn_seconds(burn_length), **kwargs)

    return click.option(
        "--burn",
        "burn_length",
        default=None,
        metavar="LENGTH",
        help="Load every GPU of every node at once for LENGTH (90s, 10m, 1h) with dense multiplies, watching its "
        "clocks, throttle reasons, temperature, power, ECC counters and the kernel's Xid lines, and compare one "
        "fixed computation's result between GPUs (the gpu.burn.* checks; default: off, the GPUs are busy for "
        "LENGTH).",
    )(command)
