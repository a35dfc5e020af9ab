"""Judge the Lightning stage (pure logic, no I/O): whether Lightning imports on every node, and the Lightning job's
rank records against the single-process Lightning reference and against what torchrun told every rank.

PASS when, within the DDP check's tolerances, Lightning's DDP across every node trains the same model as one
Lightning process on the full global batch, every rank ends bit-identical, and Lightning saw on every rank the
world size, node count, ranks and cluster environment (torchrun's) that the launch gave it.
"""

from __future__ import annotations

from collections import defaultdict

from clustercheck.checks.ddp import against_reference, incomplete, where
from clustercheck.checks.registry import Finding, declare, emit, fail, passed, skip
from clustercheck.model import CheckResult, Status

STAGE = "lightning"
IMPORT = "lightning.import"
NAME = "lightning.ddp"
TORCHRUN_ENVIRONMENT = "TorchElasticEnvironment"  # Lightning's cluster environment for a torchrun launch
INSTALL = (
    "Install Lightning (`lightning` or `pytorch_lightning`) in the node's environment: the setup playbook's "
    "python_env role takes it in python_env_packages (e.g. lightning==2.6.6 beside the pinned torch)."
)
IMPORT_CHECK = declare(
    IMPORT,
    stage=STAGE,
    scope="node",
    proves="PyTorch Lightning (`lightning` or `pytorch_lightning`) imports in the node's environment "
    "(SKIP where it does not, FAIL when --only lightning asked for it)",
    fix=INSTALL,
)
declare(
    NAME,
    stage=STAGE,
    scope="cluster",
    proves="Lightning's Trainer(num_nodes=N, devices=K, strategy='ddp'), launched by torchrun on every node, trains "
    "the same model as a single-process Lightning run on the same global batches (the DDP check's task and "
    "tolerances), every rank bit-identical, and every rank saw the world size, node count, ranks and cluster "
    "environment torchrun gave it",
    fix="A rank that saw another world size or node count runs with other launch settings or Lightning version; "
    "ranks that disagree run different code or compute differently: compare the nodes' torch and Lightning "
    "versions (lightning.import) and environments.",
)


def import_finding(answer: dict | None, error: str | None, required: bool) -> Finding:
    """One node's answer to whether Lightning imports (remote/lightning.probe(), asked by its ranks in the torch job),
    or why there is none."""
    if answer and answer.get("ok"):
        return passed(f"{answer['package']} {answer['version']} imports", **answer)
    why = error or (answer or {}).get("error") or "no answer"
    message = f"Lightning does not import: {why}"
    if required:
        return fail(message + " (--only lightning asked for it)")
    return skip(message)


SEEN = (  # what Lightning saw -> how it is named
    ("world_size", "world size"),
    ("num_nodes", "node count"),
    ("global_rank", "global rank"),
    ("local_rank", "local rank"),
    ("node_rank", "node rank"),
    ("cluster_environment", "cluster environment"),
)


def expected_view(record: dict, world_size: int, num_nodes: int) -> dict:
    """What Lightning should see on RECORD's rank: what torchrun told it, and the job's shape."""
    torchrun = record.get("torchrun") or {}
    return {
        "world_size": world_size,
        "num_nodes": num_nodes,
        "global_rank": record["rank"],
        "local_rank": record["local_rank"],
        "node_rank": int(torchrun["GROUP_RANK"]) if torchrun.get("GROUP_RANK") is not None else None,
        "cluster_environment": TORCHRUN_ENVIRONMENT,
    }


def evaluate(records: list[dict], world_size: int, num_nodes: int) -> CheckResult:
    if stopped := incomplete(records, world_size):
        cause, data = stopped
        return emit(
            NAME,
            Status.FAIL,
            f"the Lightning run did not complete: {cause}",
            remediation="Read the rank's output in the run directory (hosts/<node>/lightning/); "
            "the ddp stage shows whether plain DDP works.",
            data=data,
        )
    rank0 = next(r for r in records if r["rank"] == 0)
    reference = rank0["reference"]
    data: dict = {
        "world_size": world_size,
        "num_nodes": num_nodes,
        "lightning": rank0.get("lightning"),
        "backend": rank0.get("backend"),
        "dtype": rank0.get("dtype"),
        "steps": rank0.get("steps"),
        "max_abs_param_diff": rank0["max_abs_param_diff"],
        "max_rel_param_diff": rank0["max_rel_param_diff"],
        "reference_losses": reference["losses"],
        "lightning_losses": rank0["losses"],
        "seen": {r["rank"]: r.get("seen") for r in records},
    }

    # What Lightning saw, per node: every rank's view against torchrun's.
    problems = []
    wrong: dict[str, list[str]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r["rank"]):
        seen, expected = r.get("seen") or {}, expected_view(r, world_size, num_nodes)
        for key, label in SEEN:
            if seen.get(key) != expected[key]:
                wrong[where(r)].append(f"rank {r['rank']} saw {label} {seen.get(key)} (torchrun: {expected[key]})")
    data["nodes_seeing_otherwise"] = sorted(wrong)
    for node, what in wrong.items():
        problems.append(f"on {node} Lightning saw otherwise: " + ", ".join(what))

    compared_problems, compared = against_reference(records, rank0, "Lightning DDP", "single-process Lightning run")
    problems += compared_problems
    data.update(compared)
    version = rank0.get("lightning") or {}
    per_node = world_size // num_nodes if num_nodes else world_size
    setting = (
        f"{version.get('package', 'Lightning')} {version.get('version', '')} DDP on {world_size} ranks "
        f"({num_nodes} nodes x {per_node}, {rank0.get('backend')}, {rank0.get('dtype')}), {rank0.get('steps')} steps"
    )
    if problems:
        return emit(
            NAME,
            Status.FAIL,
            f"{setting}: " + "; ".join(problems),
            data=data,
        )
    return emit(
        NAME,
        Status.PASS,
        f"{setting} matches a single-process Lightning run: max param diff {rank0['max_abs_param_diff']:.2g}, "
        f"all ranks bit-identical; every rank saw world size {world_size}, {num_nodes} nodes, its torchrun ranks "
        f"and {TORCHRUN_ENVIRONMENT}",
        data=data,
    )
