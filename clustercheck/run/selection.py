"""What runs, decided before anything runs (like pytest's deselection): --only STAGE and --skip STAGE|GLOB.

A deselected stage does no work and reports every check it would have emitted as SKIP; a deselected check is
SKIP without being judged. The core stage always runs: the others need the facts it collects.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

STAGES = ("core", "network", "data", "collectives", "ddp", "lightning")  # in the order they run


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

    def stage_selected(self, stage: str) -> bool:
        if stage == "core":
            return True
        return (not self.only or stage in self.only) and stage not in self.skip

    def why_not_stage(self, stage: str) -> str:
        if stage in self.skip:
            return f"not selected (--skip {stage})"
        return f"not selected (--only {' '.join(self.only)})"

    def check_selected(self, name: str) -> bool:
        return not any(fnmatch.fnmatchcase(name, pattern) for pattern in self.globs)

    def why_not_check(self, name: str) -> str:
        pattern = next(p for p in self.globs if fnmatch.fnmatchcase(name, p))
        return f"not selected (--skip {pattern})"
