"""`clustercheck node-health`: the core stage's per-node checks on this machine, the way a scheduler's health
program runs (Slurm's HealthCheckProgram: as root, without the user's environment, killed after 60 s).

The facts come from the same collector the run uploads to every node (stages/core.py), run here through the local
transport with the environment's python found the same way; the checks are the registry's per-node checks. Every
probe has its own deadline and the collector one over all of them, so a hung nvidia-smi costs PROBE_DEADLINE; no
step gets more than what is left of BUDGET, so the whole program, scontrol included, ends before Slurm's 60 s.
Nothing runs across nodes, no torch job. With --slurm, the node's state is read from Slurm once the facts are in
(whether a job runs there decides whose a process on the GPUs is: the job's, or a leftover), and the node is drained
or resumed through slurm/update.py.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from clustercheck import expected, report
from clustercheck.checks import registry
from clustercheck.exitcodes import ExitCode, UsageError
from clustercheck.facts import collect
from clustercheck.facts.filesystems import Filesystems
from clustercheck.inventory import Node
from clustercheck.model import CheckResult, Status
from clustercheck.report import Report, delivery, prometheus, text
from clustercheck.slurm import breaker, epilog, update
from clustercheck.slurm.parse import SlurmNode
from clustercheck.stages import core
from clustercheck.transport.local import LocalTransport

PROBE_DEADLINE = 10.0  # each probe command of the collector (nvidia-smi, chronyc, journalctl, ...)
TORCH_DEADLINE = 20.0  # torch's import, in its own process beside the probes
PYTHON_DEADLINE = 5.0  # the environment's python to start (the first command, core.start)
COLLECTOR_DEADLINE = 25.0  # the collector as a whole: everything it started is killed then
COLLECTOR_MARGIN = 3.0  # of the collector's time, what its own start, its reads and its answer need beside the probes
SCONTROL_DEADLINE = 6.0  # each scontrol command (show, then update)
BUDGET = 50.0  # default: the whole program, under Slurm's 60 s: no step gets more than what is left of it
MIN_BUDGET = 5.0  # the least --budget: the python's start and the collector need a few seconds
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
TEXTFILE = "clustercheck_node_health.prom"
TORCH_MAX_AGE = 3600.0  # default: torch's import is run again at least hourly, and whenever what it depends on changes
KEPT_IMPORT = "node-health-import.json"  # the kept import, in kept_import_dir()
CLUSTER_MEMBER = 2  # the cluster size the checks are told: more than one node (see judge)


@dataclass(frozen=True)
class HealthRequest:
    """What `clustercheck node-health` was asked, each field an option of the command line, as given."""

    slurm: bool = False  # drain or resume this node in Slurm
    textfile_dir: str | None = None
    fmt: str = "text"
    expected_file: str | None = None
    torch_max_age: float = TORCH_MAX_AGE
    cache_dir: str | None = None
    max_drained_percent: float = breaker.MAX_DRAINED_PERCENT  # the circuit breaker's limit (slurm/breaker.py)
    max_drained_nodes: int = breaker.MAX_DRAINED_NODES
    budget: float = BUDGET  # seconds the whole program may take (its scheduler's timeout, less a margin)
    epilog: bool = False  # run as Slurm's Epilog: what the job that ended left (slurm/epilog.py)
    prolog: bool = False  # run as Slurm's Prolog: the node vetted before the job starts; exit 1 requeues it


def node_health(request: HealthRequest, echo: Callable[[str], None], say: Callable[[str], None]) -> int:
    """The per-node checks on this machine as REQUEST asks, printed (ECHO), written for node_exporter, and acted on
    in Slurm; the exit status (1 on a FAIL)."""
    models = expected.catalog(request.expected_file)
    if request.textfile_dir is not None:
        writable_directory("--textfile-dir", request.textfile_dir)
    budget = Budget(request.budget)
    # Run as slurmd runs it, with no PATH: the probes and scontrol live in the system's directories.
    os.environ["PATH"] = system_path(os.environ.get("PATH"))
    name = node_name(os.environ)
    kept = writable_directory("--cache-dir", request.cache_dir, create=True) if request.cache_dir is not None else None

    def scontrol_timeout() -> float:
        return budget.give(SCONTROL_DEADLINE)

    if request.prolog and request.epilog:
        raise UsageError("--prolog and --epilog: Slurm runs one program at a job's start, another at its end")
    hook = "--prolog" if request.prolog else "--epilog" if request.epilog else None
    job = slurm_job(os.environ, hook) if hook else None
    own = job.id if job is not None else None
    slurm = SlurmState(name, say, scontrol_timeout, own) if request.slurm or job is not None else None
    found = check(name, budget, models, torch_max_age=request.torch_max_age, kept=kept, slurm=slurm)
    document = found.report
    if job is not None and slurm is not None and request.epilog:
        document = after_job(document, name, job, slurm)
    if request.fmt == "json":
        echo(report.render(document, "json"))
    else:
        judged = sorted(document.results, key=lambda r: report.SEVERITY[r.status])
        for line in text.result_lines(judged, document.hosts):
            echo(line)
        for line in text.fix_lines(judged):
            echo(f"fix {line}")
        echo(text.counts_line(document))
    state = slurm.read() if slurm is not None else None
    withheld = None
    if state is not None:
        limit = breaker.Limit(request.max_drained_percent, request.max_drained_nodes)
        withheld = update.update(document.results, state, say, scontrol_timeout, limit, resume=job is None)
    if request.textfile_dir is not None:
        target = Path(request.textfile_dir) / TEXTFILE
        families = [drain_withheld(withheld)] if withheld is not None else []
        try:
            report.write_atomic(target, prometheus.render(document, source="node-health", extra=families) + "\n")
        except OSError as exc:
            say(f"could not write {target}: {exc.strerror or exc}")
    code = exit_code(document.status, prolog=request.prolog, withheld=withheld is not None)
    if request.prolog and code is ExitCode.OK and withheld is not None:
        say(f"job {own} starts on {name} all the same: the circuit breaker held the drain back")
    return code


def exit_code(status: Status, *, prolog: bool = False, withheld: bool = False) -> ExitCode:
    """node-health's exit status for a run whose report has STATUS: 1 on a FAIL. In a Prolog, 1 makes slurmd requeue
    the job (and the node is drained with our reason): not when the circuit breaker WITHHELD the drain, since a
    check failing on that many nodes would then stop every job from starting anywhere."""
    if status is not Status.FAIL or (prolog and withheld):
        return ExitCode.OK
    return ExitCode.CHECK_FAILED


def slurm_job(environ: dict[str, str] | os._Environ, hook: str) -> epilog.Job:
    """The job slurmd runs its Prolog or Epilog (HOOK: the option) for; a usage error in one line outside one."""
    job = epilog.job_from(environ)
    if job is None:
        what = "Prolog" if hook == "--prolog" else "Epilog"
        raise UsageError(f"{hook}: SLURM_JOB_ID and SLURM_JOB_UID are not set: it runs as Slurm's {what}")
    return job


def after_job(document: Report, name: str, job: epilog.Job, slurm: SlurmState) -> Report:
    """DOCUMENT cut to what the Epilog judges, the GPUs' checks (memory still held, a GPU in a bad state: judged with
    the ended job no longer running), and what JOB left on node NAME."""
    kept = [r for r in document.results if r.name == "facts" or r.name.startswith("gpu.")]
    others = slurm.other_jobs()
    of_user = others is None or any(uid == str(job.uid) for _, uid in others)  # unknown: nothing is blamed
    return replace(document, results=kept + epilog.judge(name, job, epilog.left_behind(job), of_user))


WITHHELD_METRIC = "clustercheck_slurm_drain_withheld"


def drain_withheld(verdict: breaker.Verdict) -> prometheus.Family:
    """The metric of a drain the circuit breaker held back: 1 for the node and the check it failed (the alert
    ClustercheckDrainWithheld counts the nodes that fail it)."""
    family = prometheus.Family(
        WITHHELD_METRIC,
        "1: this node failed the check but was not drained in Slurm: clustercheck holds drained the most of its "
        "partition's nodes it may (node-health --max-drained-percent, --max-drained-nodes)",
    )
    family.add(1, check=verdict.check, host=verdict.node)
    return family


class SlurmState:
    """This node in Slurm, read once when asked (scontrol show node): whether a job runs on it, for the checks, and
    its state, for the drain or resume after them."""

    def __init__(
        self, name: str, say: Callable[[str], None], timeout: Callable[[], float], own: str | None = None
    ) -> None:
        self.name, self.say, self.timeout = name, say, timeout
        # The job whose Prolog or Epilog this is: it does not count as running here (it has not started a process
        # yet, or has ended), so a process on a GPU then is another job's or a leftover.
        self.own = own
        self.asked = False
        self.node: SlurmNode | None = None
        self.others: list[tuple[str, str]] | None = None
        self.others_asked = False

    def read(self) -> SlurmNode | None:
        """The node's state, asked of Slurm the first time only; None when it could not be read (said why)."""
        if not self.asked:
            self.asked = True
            self.node = update.node_state(self.name, self.say, self.timeout)
        return self.node

    def job_runs(self) -> bool | None:
        """Whether a Slurm job runs on this node (in a Prolog or an Epilog: another job than its own); None when Slurm
        could not be asked."""
        if self.own is not None:
            others = self.other_jobs()
            return None if others is None else bool(others)
        node = self.read()
        return None if node is None else node.runs_job

    def other_jobs(self) -> list[tuple[str, str]] | None:
        """The jobs running here but its own (job id, user id), asked of Slurm once (squeue)."""
        if not self.others_asked:
            self.others_asked = True
            jobs = update.jobs_on(self.name, self.say, self.timeout)
            self.others = None if jobs is None else [j for j in jobs if j[0] != self.own]
        return self.others


def writable_directory(option: str, value: str, *, create: bool = False) -> Path:
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


@dataclass(frozen=True)
class Health:
    """What one node-health run found on this node."""

    report: Report


def system_path(path: str | None) -> str:
    """PATH with the system's directories added where missing: slurmd runs its health program with no PATH,
    and the probes (ufw, nft, iptables in /usr/sbin) and scontrol must be found all the same."""
    given = [p for p in (path or "").split(os.pathsep) if p]
    return os.pathsep.join(given + [p for p in SYSTEM_PATH if p not in given])


def node_name(environ: dict[str, str] | os._Environ) -> str:
    """The node's name in Slurm: SLURMD_NODENAME (slurmd sets it for its health program), else the short
    hostname (Slurm's NodeName is the short name unless the configuration says otherwise)."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


class Budget:
    """What is left of BUDGET seconds from its start: a step's deadline is its own, or what is left if less."""

    def __init__(self, seconds: float = BUDGET) -> None:
        self.until = time.monotonic() + seconds

    def give(self, deadline: float) -> float:
        return max(1.0, min(deadline, self.until - time.monotonic()))


def kept_import_dir() -> Path:
    """Where node-health keeps torch's last successful import: /var/cache/clustercheck for root (slurmd's health
    program), the user's cache directory otherwise."""
    if os.geteuid() == 0:
        return Path("/var/cache/clustercheck")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "clustercheck"


def check(
    name: str,
    budget: Budget,
    models: expected.Catalog | None = None,
    *,
    torch_max_age: float = TORCH_MAX_AGE,
    kept: Path | None = None,
    slurm: SlurmState | None = None,
) -> Health:
    """Collect this machine's facts and run every per-node check on them, as node NAME, against the expected
    values MODELS (default: the shipped ones). torch's last successful import, kept in the directory KEPT
    (default: kept_import_dir()), is reused while younger than TORCH_MAX_AGE seconds and while nothing it depends
    on changed (the collector's import_fingerprint); 0 imports torch every run. With SLURM, Slurm is asked once the
    facts are in whether a job runs on this node."""
    started_at = time.time()
    node = Node(name=name, address="localhost", connection="local")
    transport = LocalTransport(host=name)
    reuse: list[str] = []
    if torch_max_age > 0:
        directory = kept or kept_import_dir()
        try:
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            reuse = ["--reuse-import", str(directory / KEPT_IMPORT), str(torch_max_age)]
        except OSError:
            pass  # nowhere to keep it: torch is imported every run
    try:
        results = _check(node, transport, budget, models, reuse, slurm)
    finally:
        transport.cleanup()  # whatever a probe left past its deadline (a hung nvidia-smi's children) is killed
    return Health(delivery.build(results, [name], transport.run_id, started_at))


def _check(
    node: Node,
    transport: LocalTransport,
    budget: Budget,
    models: expected.Catalog | None,
    reuse: list[str],
    slurm: SlurmState | None,
) -> list[CheckResult]:
    # The collector imports torch with the environment's python; when that does not start, python3 collects
    # without torch (core.start), and the reused import does not apply.
    first, deadline = budget.give(PYTHON_DEADLINE), budget.give(COLLECTOR_DEADLINE)
    probes, torch = probe_shares(deadline)
    args = [f"{torch:g}", "--probe-timeout", f"{probes:g}", *reuse]
    kept = (f"clustercheck={Path(reuse[1]).parent}",) if reuse else ()  # its cache directory: judged too
    begun = core.start(node, transport, None, timeout=first, collect=args, collect_timeout=deadline, paths=kept)
    python, source, missing = begun.python, begun.source, begun.missing
    facts_check = registry.get("facts")
    collected = begun.collected
    if collected is None or collected.raw is None:
        cause = begun.facts_problem(deadline)
        finding = registry.Finding(Status.ERROR, f"could not collect facts with {python}: {cause}", begun.facts_fix())
        return [facts_check.result(node.name, finding)]
    raw, took = collected.raw, collected.seconds
    results = [facts_check.result(node.name, registry.passed(f"facts collected with {python} in {took:.1f} s"))]
    job = slurm.job_runs() if slurm is not None else None
    found = begun.filesystems
    return results + judge(
        node, raw, python=python, source=source, missing=missing, models=models, slurm_job=job, filesystems=found
    )


def probe_shares(collector: float) -> tuple[float, float]:
    """Each probe's share of the collector's COLLECTOR seconds, and torch's import's: what is left of it after
    COLLECTOR_MARGIN, at most PROBE_DEADLINE and TORCH_DEADLINE. A probe past its share is given up and named
    (hung: its checks FAIL, checks/registry.py), so the collector still answers within its time instead of being
    killed with nothing said about what hung."""
    left = max(1.0, collector - COLLECTOR_MARGIN)
    return round(min(PROBE_DEADLINE, left), 1), round(min(TORCH_DEADLINE, left), 1)


def judge(
    node: Node,
    raw: dict,
    *,
    python: str,
    source: str,
    missing: str | None = None,
    models: expected.Catalog | None = None,
    slurm_job: bool | None = None,
    filesystems: Filesystems | None = None,
) -> list[CheckResult]:
    """Every per-node check on the collector's output RAW, as node-health judges its node (pure), against the
    expected values MODELS (default: the shipped ones); SLURM_JOB: whether a Slurm job runs on it (None: not
    asked); FILESYSTEMS: what the first command read of the file systems a job needs."""
    # No inventory says how many GPUs to expect here: the NVIDIA GPUs on the PCI bus do, so a GPU node whose
    # nvidia-smi hangs or fails is a FAIL (gpu.count), not a node without GPUs.
    on_bus = len(((raw.get("gpu_bridges") or {}).get("gpus")) or {})
    node = replace(node, gpus_expected=on_bus or node.gpus_expected)
    # A node a health program watches is one of a cluster's: what matters only across nodes (a stopped time
    # service, a hostname that resolves to loopback) is judged as it is in a run over several nodes.
    facts = collect.build(
        node, raw, python=python, python_source=source, python_missing=missing, cluster_size=CLUSTER_MEMBER
    )
    given = {"models": models} if models is not None else {}
    facts = replace(facts, slurm_job=slurm_job, filesystems=filesystems, **given)
    return registry.run_node_checks(facts)
