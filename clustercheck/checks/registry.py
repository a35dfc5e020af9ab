"""The check registry: every check clustercheck can report, defined once, with its name, stage, scope, what it
proves and its default fix.

A per-node check is one decorated function `facts -> Finding`:

    @node_check("shm.size", proves="/dev/shm is large enough for NCCL and DataLoader workers",
                fix="Enlarge /dev/shm ...", reads=("shm",))
    def shm_size(facts: NodeFacts) -> Finding:
        ...

The runner (run_node_checks) turns what the function cannot judge into the right outcome under the right name:
a deselected check (--skip) is SKIP without running, a GPU check on a node without GPUs is SKIP, a fact it reads
that could not be collected is the check's `unknown` status with the reason, and an exception is ERROR.
Cross-node checks (`cluster_check`) take every node's facts. Checks that a multi-node stage emits are declared
with `declare` so the catalog (`clustercheck checks`) and the JUnit test set know them before the stage runs.

Every result is made here: `result(name, host, finding)` (and `emit`, the same with the finding written out) adds
the name, the stage, the host and the declared fix, and refuses a name nobody declared. A finding carries its
measured values typed (`measures`, see model.Metric), which the metrics outputs render.

A SKIP carries why as data (model.Skip), set here: a check that judged nothing says why in its own words (`skip`,
or a stage's `emit(name, Status.SKIP, REASON, host=...)`), a check that did not run at all is `not_run` (or
`skipped`, in the shape a run gives) with the reason, or the options that left it out (Selection.why_not_*). A
reason names neither its host nor its check (model.Skip's rule): every SKIP's message is worded from it in one
place (model.skipped_message, called by Check.result only), the host put in front there, once. The reports read
the reason and the options, never the message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from clustercheck.facts.model import COULD_NOT_COLLECT, HUNG, NodeFacts
from clustercheck.model import CheckResult, Measure, Skip, Status, skipped_message
from clustercheck.selection import Selection

SCOPES = ("node", "cluster", "master")  # one result per node, one for the cluster, one on the first node


@dataclass(frozen=True)
class Finding:
    """What a check function found; the registry adds the name, the host and the default fix (result())."""

    status: Status
    message: str
    fix: str | None = None  # None: the check's default fix (shown for WARN, FAIL and ERROR)
    data: dict[str, Any] = field(default_factory=dict)
    measures: tuple[Measure, ...] = ()  # the measured values the metrics outputs carry (report/prometheus.py)
    skip: Skip | None = None  # a SKIP of a check that did not run: why (None: a SKIP's message is its reason)


def passed(message: str, **data: Any) -> Finding:
    return Finding(Status.PASS, message, "", data)


def warn(message: str, fix: str | None = None, **data: Any) -> Finding:
    return Finding(Status.WARN, message, fix, data)


def fail(message: str, fix: str | None = None, **data: Any) -> Finding:
    return Finding(Status.FAIL, message, fix, data)


def skip(message: str, **data: Any) -> Finding:
    """SKIP in the check's own words: MESSAGE (without the host, which the registry puts in front) is the reason."""
    return Finding(Status.SKIP, message, "", data)


def unanswered(answer: Any, not_asked: str, program: str, could_not: str) -> Finding | None:
    """The finding of a check judging a node program's ANSWER (its `problem`: nothing to do there; its `failure`: it
    gave no answer), or None where the answer is there to judge: no ANSWER SKIPs with NOT_ASKED, a problem SKIPs with
    it, a failure FAILs as "the GPUs COULD_NOT: PROGRAM: why"."""
    if answer is None:
        return skip(not_asked)
    if answer.problem:
        return skip(answer.problem)
    if answer.failure:
        return fail(f"the GPUs {could_not}: {program}: {answer.failure}", failure=answer.failure)
    return None


def not_run(why: str | Skip, **data: Any) -> Finding:
    """SKIP of a check that did not run at all, for WHY (a reason, or model.Skip with the options that left it
    out); its message is model.skipped_message's."""
    reason = why if isinstance(why, Skip) else Skip(why)
    return Finding(Status.SKIP, "", "", data, skip=reason)


@dataclass(frozen=True)
class Check:
    name: str
    stage: str  # the stage that runs it (core, network, collectives, ddp)
    scope: str  # node, cluster or master (see SCOPES)
    proves: str  # what a PASS proves, in one sentence
    fix: str = ""  # the default remediation
    reads: tuple[str, ...] = ()  # NodeFacts fields it needs; None there means "could not collect"
    needs_gpu: bool = False  # SKIP on a node without NVIDIA GPUs (unless the inventory expects some)
    unknown: Status = Status.WARN  # the outcome when a fact it reads could not be collected
    function: Callable[..., Finding] | None = None  # None: emitted by its stage

    def result(self, host: str | None, finding: Finding, *, named: bool = False) -> CheckResult:
        """This check's result on HOST (None: the cluster): its name, its stage, the host, for a WARN, FAIL or
        ERROR whose finding gives no fix of its own the declared fix, and for a SKIP why (Skip). The message gets
        the host in front unless it is NAMED already (a stage's messages name their nodes themselves); a SKIP's
        message is its reason, which names no host (model.Skip), worded by model.skipped_message with the host."""
        reason = None
        if finding.status is Status.SKIP:
            reason = finding.skip or Skip(finding.message)
            message = skipped_message(self.name, reason.reason, host, ran=finding.skip is None)
        else:
            message = f"{host}: {finding.message}" if host and not named else finding.message
        if finding.status in (Status.PASS, Status.SKIP):
            fix = finding.fix or ""
        else:
            fix = finding.fix if finding.fix is not None else self.fix
        return CheckResult(
            self.name,
            finding.status,
            message,
            host=host,
            remediation=fix,
            data=dict(finding.data),
            measures=tuple(finding.measures),
            stage=self.stage,
            skip=reason,
        )

    def not_run(self, host: str | None, why: str | Skip) -> CheckResult:
        """This check on HOST, not run: SKIP for WHY (see not_run())."""
        return self.result(host, not_run(why))


class UndeclaredCheck(LookupError):
    """A result under a name the registry does not know: a bug (a typo, or a check nobody declared)."""


REGISTRY: dict[str, Check] = {}


def _register(check: Check) -> Check:
    if check.name in REGISTRY:
        raise ValueError(f"check {check.name} is defined twice")
    if check.scope not in SCOPES:
        raise ValueError(f"check {check.name}: scope {check.scope} is not one of {SCOPES}")
    REGISTRY[check.name] = check
    return check


def node_check(
    name: str,
    *,
    proves: str,
    fix: str = "",
    reads: tuple[str, ...] = (),
    needs_gpu: bool = False,
    unknown: Status = Status.WARN,
) -> Callable[[Callable[[NodeFacts], Finding]], Callable[[NodeFacts], Finding]]:
    def register(function: Callable[[NodeFacts], Finding]) -> Callable[[NodeFacts], Finding]:
        _register(Check(name, "core", "node", proves, fix, reads, needs_gpu, unknown, function))
        return function

    return register


def cluster_check(
    name: str, *, proves: str, fix: str = ""
) -> Callable[[Callable[..., Finding]], Callable[..., Finding]]:
    """A check over every node's facts: function(list[NodeFacts], config) -> Finding."""

    def register(function: Callable[..., Finding]) -> Callable[..., Finding]:
        _register(Check(name, "core", "cluster", proves, fix, function=function))
        return function

    return register


def declare(name: str, *, stage: str, scope: str, proves: str, fix: str = "") -> Check:
    """A check whose results its stage emits (the network probe, a torch job)."""
    return _register(Check(name, stage, scope, proves, fix))


def get(name: str) -> Check:
    """The declared check NAME; an undeclared name raises UndeclaredCheck."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UndeclaredCheck(f"check {name!r} is not declared in the check registry") from None


def result(name: str, host: str | None, finding: Finding) -> CheckResult:
    """The one way a stage's finding becomes a result: the declared check NAME's result on HOST (None: the
    cluster), the message as the stage wrote it (it names its nodes; a SKIP's is its reason, which names neither
    HOST nor NAME: the registry puts HOST in front), the declared fix where the finding gives none. An undeclared
    NAME raises UndeclaredCheck."""
    return get(name).result(host, finding, named=True)


def emit(
    name: str,
    status: Status,
    message: str,
    *,
    host: str | None = None,
    remediation: str | None = None,
    data: dict[str, Any] | None = None,
    measures: tuple[Measure, ...] = (),
) -> CheckResult:
    """result() for a finding written out: STATUS, MESSAGE, REMEDIATION (None: the declared fix), DATA, MEASURES."""
    return result(name, host, Finding(status, message, remediation, dict(data or {}), tuple(measures)))


def with_fix_command(result: CheckResult, command: str) -> CheckResult:
    """RESULT with COMMAND, the setup line that puts it right (checks/setup_roles.py), in its remediation and as
    data."""
    remediation = f"{result.remediation} Or rerun the role that sets it: {command}".strip()
    return replace(result, remediation=remediation, fix_command=command)


def with_evidence(result: CheckResult, directory: str, kept: dict[str, Any]) -> CheckResult:
    """RESULT saying where the evidence of its failure was kept (DIRECTORY in the run directory; KEPT: what, as
    data)."""
    return replace(
        result, message=f"{result.message} (evidence kept: {directory})", data={**result.data, "evidence": kept}
    )


def of_stage(stage: str) -> list[Check]:
    return [c for c in REGISTRY.values() if c.stage == stage]


def node_checks() -> list[Check]:
    return [c for c in REGISTRY.values() if c.function is not None and c.scope == "node"]


def cluster_checks() -> list[Check]:
    return [c for c in REGISTRY.values() if c.function is not None and c.scope == "cluster"]


EVERY = Selection()  # every check selected


def run_node_checks(facts: NodeFacts, selection: Selection = EVERY) -> list[CheckResult]:
    """Every per-node check on FACTS, in registry order, those SELECTION leaves out SKIP; never raises."""
    results = []
    for check in node_checks():
        results.append(_run_one(check, facts, selection))
    return results


def _run_one(check: Check, facts: NodeFacts, selection: Selection) -> CheckResult:
    host = facts.host
    if not selection.check_selected(check.name):
        return check.not_run(host, selection.why_not_check(check.name))
    if check.needs_gpu and facts.smi is None:
        if facts.gpu_expected:
            return check.result(host, skip("nvidia-smi did not answer (see gpu.count)"))
        return check.result(host, skip("no NVIDIA GPU on this node (none expected)"))
    unknown = [name for name in check.reads if getattr(facts, name) is None]
    if unknown:
        what = ", ".join(f"{name}: {facts.missing.get(name, COULD_NOT_COLLECT)}" for name in unknown)
        hung = [facts.missing[name] for name in unknown if facts.missing.get(name, "").startswith(HUNG)]
        if hung:
            # What it reads never came (a probe stuck in the kernel, a read that does not return): a fault of the
            # node's, named by this check (`hung: nvidia-smi -q gave no answer within 10 s`), not a fact missing.
            fix = "Find what hangs there (ps -eo pid,stat,wchan:32,cmd | grep ' D'; dmesg); a reboot clears it."
            return check.result(host, Finding(Status.FAIL, "; ".join(dict.fromkeys(hung)), fix))
        return check.result(host, Finding(check.unknown, f"{check.name}: {COULD_NOT_COLLECT} ({what})"))
    assert check.function is not None
    try:
        return check.result(host, check.function(facts))
    except Exception as exc:  # a bug in one check is that check's ERROR, under its own name
        return check.result(host, Finding(Status.ERROR, f"check {check.name} failed: {type(exc).__name__}: {exc}", ""))


def run_cluster_checks(nodes: list[NodeFacts], config: Any, selection: Selection = EVERY) -> list[CheckResult]:
    """Every cross-node check on NODES' facts, those SELECTION leaves out SKIP; never raises."""
    results = []
    for check in cluster_checks():
        if not selection.check_selected(check.name):
            results.append(check.not_run(None, selection.why_not_check(check.name)))
            continue
        assert check.function is not None
        try:
            results.append(check.result(None, check.function(nodes, config)))
        except Exception as exc:
            results.append(
                check.result(None, Finding(Status.ERROR, f"check {check.name} failed: {type(exc).__name__}: {exc}"))
            )
    return results


def skipped(check: Check, hosts: list[str], why: str | Skip) -> list[CheckResult]:
    """CHECK not run, for WHY, in the shape a run gives (one per node, one for the cluster, one on the first
    node), so a skipped stage and a run stage list the same checks."""
    if check.scope == "node":
        return [check.not_run(h, why) for h in hosts]
    if check.scope == "master":
        return [check.not_run(hosts[0] if hosts else None, why)]
    return [check.not_run(None, why)]
