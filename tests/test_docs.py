"""docs/distributed-checks.md's stage table is the pipeline's stages, in their order, with the checks each reports."""

from __future__ import annotations

import re
from pathlib import Path

from clustercheck import catalog
from clustercheck.selection import STAGES

REPO = Path(__file__).resolve().parent.parent


def test_distributed_checks_doc_lists_every_stage_with_its_checks():
    text = (REPO / "docs" / "distributed-checks.md").read_text()
    table = text.split("| stage | worker", 1)[1].split("\n\n", 1)[0]
    rows = table.splitlines()[2:]
    stages = [row.split("|")[1].strip().strip("`") for row in rows]
    assert stages == list(STAGES)
    by_stage: dict[str, set[str]] = {}
    for entry in catalog.entries():
        by_stage.setdefault(entry["stage"], set()).add(entry["name"])
    for stage, row in zip(stages, rows, strict=True):
        if stage == "core":  # its dozens of per-node checks are docs/checks.md's table
            continue
        listed = set(re.findall(r"`([\w.]+)`", row.rsplit("|", 2)[1]))
        assert listed == by_stage[stage], stage
