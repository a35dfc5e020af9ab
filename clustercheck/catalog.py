"""The catalog of checks, from the registry: `clustercheck checks`, the README's stage table and checks tables."""

from __future__ import annotations

import json

from clustercheck import checks
from clustercheck.selection import DECLARED, STAGES


def entries() -> list[dict]:
    ordered = sorted(checks.REGISTRY.values(), key=lambda c: STAGES.index(c.stage))  # stable: registry order within
    return [
        {
            "name": c.name,
            "stage": c.stage,
            "scope": c.scope,
            "proves": c.proves,
            "fix": c.fix,
            "needs_gpu": c.needs_gpu,
        }
        for c in ordered
    ]


def render(fmt: str = "text") -> str:
    if fmt == "markdown":
        return markdown_tables().rstrip("\n")
    if fmt == "json":
        return json.dumps({"schema_version": 1, "checks": entries()}, indent=2)
    lines = []
    for entry in entries():
        lines.append(f"{entry['name']}  [{entry['stage']}, per {entry['scope']}]")
        lines.append(f"    proves: {entry['proves']}")
        if entry["fix"]:
            lines.append(f"    fix:    {entry['fix']}")
    return "\n".join(lines)


def markdown_tables() -> str:
    """One table per stage, for the README (a test keeps the README equal to this)."""
    out = []
    for stage in STAGES:
        rows = [e for e in entries() if e["stage"] == stage]
        out.append(f"#### Stage `{stage}`\n")
        out.append("| check | per | what a PASS proves | fix |")
        out.append("| --- | --- | --- | --- |")
        for e in rows:
            cell = e["fix"].replace("|", "\\|")
            proves = e["proves"].replace("|", "\\|") + (" (GPU nodes)" if e["needs_gpu"] else "")
            out.append(f"| `{e['name']}` | {e['scope']} | {proves} | {cell} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def stage_table() -> str:
    """The stages, what runs in each and its checks, for the README (a test keeps the README equal to this)."""
    out = ["| stage | what runs | checks |", "| --- | --- | --- |"]
    for stage in DECLARED:
        names = [e["name"] for e in entries() if e["stage"] == stage.name]
        out.append(f"| `{stage.name}` | {stage.runs} | {', '.join(f'`{n}`' for n in families(names))} |")
    return "\n".join(out) + "\n"


def families(names: list[str]) -> list[str]:
    """NAMES in order, three or more sharing a first word (gpu.ecc, gpu.xid, ...) as one `gpu.*`."""
    first = [n.split(".")[0] for n in names]
    out: list[str] = []
    for name, word in zip(names, first, strict=True):
        shown = f"{word}.*" if "." in name and sum(w == word for w in first) >= 3 else name
        if shown not in out:
            out.append(shown)
    return out
