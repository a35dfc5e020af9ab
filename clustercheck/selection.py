"""The stages of a run, declared once, and what runs of them, decided before anything runs (like pytest's
deselection): --only STAGE and --skip STAGE|GLOB.

`DECLARED` is the one stage list: the pipeline's order, --only's choices, --skip's help, the catalog and the
README's stage table come from it (each stage's checks are the ones the check registry declares under its name).
A deselected stage does no work and reports every check it would have emitted as SKIP; a deselected check is
SKIP without being judged. The core stage always runs: the others need the facts it collects. A stage an option
asks for (baseline, by --baseline) runs whenever the option is given, whatever --only keeps, unless --skip names it.
What left a check out is told as data (model.Skip: the reason, and the options that did it). Like --only with a name
that is not a stage, --skip with a name that is neither a stage nor matches a check of the catalog is refused
(Selection.against), before anything runs.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass

from clustercheck.model import Skip


@dataclass(frozen=True)
class Stage:
    name: str  # --only and --skip take it; its module is clustercheck/stages/<name>.py
    runs: str  # what runs, in the README's stage table
    needs_torch: bool = False  # it starts torch: SKIP when torch does not import on a node
    gates: bool = True  # a problem here skips the stages after it
    asked_by: str | None = None  # an option without which the stage reports nothing (not even SKIP)


DECLARED = (  # in the order they run
    Stage(
        "core",
        "per node: connect, facts, per-node checks, node-local collectives (a part of the torch job when one "
        "follows); then cross-node consistency",
    ),
    Stage("network", "a TCP probe on every node at once (python3 only, no torch)"),
    Stage(
        "data",
        "`--shared-dir` is one writable filesystem on every node; every `--data-path` has the same content on every "
        "node (python3 only)",
        gates=False,  # the torch stages do not read the user's data
    ),
    Stage(
        "collectives",
        "the run's one torch job (one torchrun on every node, one process group per rank, shared by the torch "
        "stages): collective correctness, an all_reduce bandwidth sweep, then rounds of node pairs over every rail",
        needs_torch=True,
    ),
    Stage(
        "ddp",
        "the torch job: DDP against a single-process reference, and a checkpoint saved half-way by rank 0, "
        "loaded by every rank and resumed",
        needs_torch=True,
    ),
    Stage(
        "lightning",
        "the torch job, where Lightning imports on every rank: "
        '`Trainer(num_nodes=N, devices=K, strategy="ddp")` against a single-process Lightning run',
        needs_torch=True,
    ),
    Stage(
        "baseline",
        "with `--baseline REPORT.json` only: this run's figures, versions and nodes against an earlier report's "
        "(nothing without it)",
        gates=False,
        asked_by="--baseline",
    ),
)
STAGES = tuple(s.name for s in DECLARED)
DISTRIBUTED = tuple(s.name for s in DECLARED[1:] if s.asked_by is None)  # the multi-node stages, over every node


def stage(name: str) -> Stage:
    return next(s for s in DECLARED if s.name == name)


class SelectionError(ValueError):
    """--only/--skip that cannot work; printed as one line."""


@dataclass(frozen=True)
class Selection:
    only: tuple[str, ...] = ()  # stages asked for with --only
    skip: tuple[str, ...] = ()  # stages and check-name globs given to --skip

    def __post_init__(self) -> None:
        unknown = [s for s in self.only if s not in STAGES]
        if unknown:
            raise SelectionError(f"--only {unknown[0]}: not a stage ({', '.join(STAGES)})")
        if "core" in self.skip:
            raise SelectionError("--skip core: the core stage collects the facts every other stage needs; use --only")

    @property
    def globs(self) -> tuple[str, ...]:
        return tuple(s for s in self.skip if s not in STAGES)

    def stage_selected(self, name: str) -> bool:
        if name == "core":
            return True
        if stage(name).asked_by:  # its option asks for it, whatever --only keeps of the others
            return name not in self.skip
        return (not self.only or name in self.only) and name not in self.skip

    def against(self, checks: Iterable[str]) -> Selection:
        """This selection, every --skip name checked against the catalog's check names CHECKS: one that is neither
        a stage nor matches a check is refused, as --only refuses a name that is not a stage (a typo would
        otherwise leave in what it meant to leave out, and say nothing)."""
        names = list(checks)
        for pattern in self.globs:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                stages = ", ".join(s for s in STAGES if s != "core")
                raise SelectionError(
                    f"--skip {pattern}: not a stage ({stages}) and no check's name matches it (clustercheck checks "
                    "lists them)"
                )
        return self

    def why_not_stage(self, stage: str) -> Skip:
        if stage in self.skip:
            return Skip.deselected(f"--skip {stage}")
        return Skip.deselected(f"--only {' '.join(self.only)}")

    def check_selected(self, name: str) -> bool:
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.globs)

    def why_not_check(self, name: str) -> Skip:
        return self.why_not_checks([name])

    def why_not_checks(self, names: Iterable[str]) -> Skip:
        """Why the checks NAMES (every one deselected) are left out: the --skip globs that match them."""
        names = list(names)
        patterns = [p for p in self.globs if any(fnmatch.fnmatchcase(n, p) for n in names)]
        return Skip.deselected(f"--skip {' '.join(patterns)}")
