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


# ------------------------------------------------------------------------------------------- links

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lower-case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a markdown file; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", text).splitlines():
        heading = re.match(r"#{1,6} (.*)", line)
        if heading:
            base = anchor(heading.group(1))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def broken_links(path: Path) -> list[str]:
    """The relative links of a markdown file whose file or #anchor does not exist."""
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.name}: {target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text()):
            broken.append(f"{path.name}: {target}: no such heading in {dest.name}")
    return broken


def test_anchors_follow_github_s_rules():
    assert anchor("Verifying a cluster: `clustercheck run`") == "verifying-a-cluster-clustercheck-run"
    assert anchor("Through Slurm: `--slurm`") == "through-slurm---slurm"
    assert anchor("Tests, by what they need") == "tests-by-what-they-need"
    assert anchor("Stage `core`") == "stage-core"
    assert anchors("# A\n```sh\n# not a heading\n```\n## A\n") == {"a", "a-1"}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n[ok](#top) [file](b.md#there) [gone](c.md) [nowhere](b.md#here)\n")
    (tmp_path / "b.md").write_text("# There\n")
    assert broken_links(tmp_path / "a.md") == ["a.md: c.md: no such file", "a.md: b.md#here: no such heading in b.md"]


def test_every_relative_link_and_anchor_resolves():
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    assert [b for page in pages for b in broken_links(page)] == []
