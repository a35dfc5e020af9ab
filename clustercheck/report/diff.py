"""`clustercheck diff OLD.json NEW.json`: what changed between two reports of a cluster: nodes added or gone,
versions, check statuses, and figures worse than their tolerance (the comparison `run --baseline` makes,
checks/baseline.py), rendered as text, Markdown or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clustercheck.checks import baseline
from clustercheck.model import Status

FORMATS = ("text", "markdown", "json")
DIFF_VERSION = 1  # the JSON output's version: fields are only added within it


@dataclass(frozen=True)
class StatusChange:
    name: str
    host: str | None
    old: str
    new: str

    @property
    def where(self) -> str:
        return f"{self.name} on {self.host}" if self.host else f"{self.name} (cluster)"


@dataclass(frozen=True)
class Diff:
    old: dict[str, Any]
    new: dict[str, Any]
    hosts_added: list[str]
    hosts_gone: list[str]
    versions: list[baseline.VersionChange]
    statuses: list[StatusChange]
    figures: list[baseline.Change]  # worse than their tolerance, FAIL first
    compared: int  # figures compared in all

    @property
    def failed(self) -> bool:
        """A figure got worse past its FAIL bound."""
        return any(c.status is Status.FAIL for c in self.figures)


def _statuses(checks: list[dict]) -> dict[tuple[str, str | None], str]:
    """(check, host) -> status; a check reported several times on a host keeps its worst."""
    order = ["ERROR", "FAIL", "WARN", "PASS", "SKIP"]
    out: dict[tuple[str, str | None], str] = {}
    for check in checks:
        key = (check["name"], check["host"])
        if key not in out or order.index(check["status"]) < order.index(out[key]):
            out[key] = check["status"]
    return out


def diff(old: dict[str, Any], new: dict[str, Any], tolerances: dict[str, baseline.Tolerance] | None = None) -> Diff:
    """What changed from OLD to NEW (two report documents)."""
    added, gone = baseline.hosts_changed(old, new)
    then, now = _statuses(old["checks"]), _statuses(new["checks"])
    statuses = [
        StatusChange(name, host, then[(name, host)], now[(name, host)])
        for name, host in now
        if (name, host) in then and then[(name, host)] != now[(name, host)]
    ]
    comparisons = baseline.compare_reports(old, new, tolerances)
    worse = sorted(
        (c for comparison in comparisons.values() for c in comparison.regressions),
        key=lambda c: (c.status is not Status.FAIL, c.figure, c.key),
    )
    compared = sum(len(c.changes) for c in comparisons.values())
    return Diff(old, new, added, gone, baseline.version_changes(old, new), statuses, worse, compared)


def _run(document: dict[str, Any]) -> dict[str, Any]:
    return {key: document.get(key) for key in ("run_id", "started_at", "status")}


def to_json(d: Diff) -> dict[str, Any]:
    return {
        "diff_version": DIFF_VERSION,
        "old": _run(d.old),
        "new": _run(d.new),
        "hosts_added": d.hosts_added,
        "hosts_gone": d.hosts_gone,
        "versions": [v.to_dict() for v in d.versions],
        "statuses": [{"name": s.name, "host": s.host, "old": s.old, "new": s.new} for s in d.statuses],
        "figures": [c.to_dict() for c in d.figures],
        "figures_compared": d.compared,
        "regressed": d.failed,
    }


def _sections(d: Diff, code) -> list[tuple[str, list[str]]]:
    return [
        ("nodes", [f"{code(h)} added" for h in d.hosts_added] + [f"{code(h)} gone" for h in d.hosts_gone]),
        ("versions", [v.message for v in d.versions]),
        ("statuses", [f"{code(s.where)}: {s.old} -> {s.new}" for s in d.statuses]),
        ("figures worse than their tolerance", [f"{c.status.value} {c.message}" for c in d.figures]),
    ]


def _summary(d: Diff) -> str:
    old, new = d.old.get("started_at"), d.new.get("started_at")
    when = f"{old or '?'} -> {new or '?'}: " if old or new else ""
    verdict = f"{d.old.get('status')} -> {d.new.get('status')}"
    worse = f"{len(d.figures)} of {d.compared} figure(s) worse than their tolerance"
    return f"{when}{verdict}; {worse}" + ("; a regression past its FAIL bound" if d.failed else "")


def render(d: Diff, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(d), indent=2)
    if fmt == "markdown":
        out = ["### clustercheck diff", "", _summary(d)]
        for title, items in _sections(d, lambda t: f"`{t}`"):
            out += ["", f"**{title}**: {len(items) or 'none'}"] + (
                [""] + [f"- {item}" for item in items] if items else []
            )
        return "\n".join(out)
    out = [_summary(d)]
    for title, items in _sections(d, str):
        out += [f"{title}: {len(items) or 'none'}"] + [f"  {item}" for item in items]
    return "\n".join(out)
