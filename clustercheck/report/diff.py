"""`clustercheck diff OLD.json NEW.json`: what changed between two reports of a cluster: nodes added or gone,
versions, check statuses, and figures worse than their tolerance (the comparison `run --baseline` makes,
checks/baseline.py), rendered as text, Markdown or JSON.

Only the nodes both reports checked are compared, and the cluster-wide figures only when both checked the same
nodes; two reports with no node in common are of different clusters: that is said, nothing is compared, and the
diff fails."""

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
    nodes: baseline.Nodes
    versions: list[baseline.VersionChange]
    statuses: list[StatusChange]
    figures: list[baseline.Change]  # worse than their tolerance, FAIL first
    compared: int  # figures compared in all
    not_compared: list[str]  # cluster-wide figures both measured, across other nodes

    @property
    def hosts_added(self) -> list[str]:
        return self.nodes.added

    @property
    def hosts_gone(self) -> list[str]:
        return self.nodes.gone

    @property
    def regressed(self) -> bool:
        """A figure got worse past its FAIL bound."""
        return any(c.status is Status.FAIL for c in self.figures)

    @property
    def failed(self) -> bool:
        """A figure got worse past its FAIL bound, or the reports have no node in common (nothing compared)."""
        return self.regressed or self.nodes.unrelated


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
    """What changed from OLD to NEW (two report documents); nothing compared when they have no node in common."""
    nodes = baseline.node_sets(old, new)
    if nodes.unrelated:
        return Diff(old, new, nodes, [], [], [], 0, [])
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
    not_compared = [key for c in comparisons.values() for key in c.not_compared]
    return Diff(old, new, nodes, baseline.version_changes(old, new), statuses, worse, compared, not_compared)


def _run(document: dict[str, Any]) -> dict[str, Any]:
    return {key: document.get(key) for key in ("run_id", "started_at", "status")}


def to_json(d: Diff) -> dict[str, Any]:
    return {
        "diff_version": DIFF_VERSION,
        "old": _run(d.old),
        "new": _run(d.new),
        "hosts_added": d.hosts_added,
        "hosts_gone": d.hosts_gone,
        "hosts_common": d.nodes.common,
        "versions": [v.to_dict() for v in d.versions],
        "statuses": [{"name": s.name, "host": s.host, "old": s.old, "new": s.new} for s in d.statuses],
        "figures": [c.to_dict() for c in d.figures],
        "figures_compared": d.compared,
        "figures_not_compared": d.not_compared,
        "regressed": d.regressed,
    }


NOT_COMPARED = "not compared"


def _sections(d: Diff, code) -> list[tuple[str, list[str] | None]]:
    """Each section's title and items; None: not compared (no node in common)."""
    unrelated = d.nodes.unrelated
    sections: list[tuple[str, list[str] | None]] = [
        ("nodes", [f"{code(h)} added" for h in d.hosts_added] + [f"{code(h)} gone" for h in d.hosts_gone]),
        ("versions", None if unrelated else [v.message for v in d.versions]),
        ("statuses", None if unrelated else [f"{code(s.where)}: {s.old} -> {s.new}" for s in d.statuses]),
        (
            "figures worse than their tolerance",
            None if unrelated else [f"{c.status.value} {c.message}" for c in d.figures],
        ),
    ]
    if d.not_compared:
        what = f"cluster-wide figures not compared, measured across other nodes ({d.nodes.across()})"
        sections.append((what, [code(key) for key in d.not_compared]))
    return sections


def _summary(d: Diff) -> str:
    old, new = d.old.get("started_at"), d.new.get("started_at")
    when = f"{old or '?'} -> {new or '?'}: " if old or new else ""
    if d.nodes.unrelated:
        return (
            f"{when}no node in common: OLD checked {', '.join(d.nodes.baseline) or 'none'}, NEW checked "
            f"{', '.join(d.nodes.now) or 'none'}; nothing compared (reports of different clusters, or of these "
            "nodes under other names)"
        )
    verdict = f"{d.old.get('status')} -> {d.new.get('status')}"
    worse = f"{len(d.figures)} of {d.compared} figure(s) worse than their tolerance"
    common = "" if d.nodes.same else f"; compared on the node(s) in both: {', '.join(d.nodes.common)}"
    return f"{when}{verdict}; {worse}{common}" + ("; a regression past its FAIL bound" if d.regressed else "")


def _count(items: list[str] | None) -> str:
    return NOT_COMPARED if items is None else str(len(items) or "none")


def render(d: Diff, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(to_json(d), indent=2)
    if fmt == "markdown":
        out = ["### clustercheck diff", "", _summary(d)]
        for title, items in _sections(d, lambda t: f"`{t}`"):
            out += ["", f"**{title}**: {_count(items)}"] + ([""] + [f"- {item}" for item in items] if items else [])
        return "\n".join(out)
    out = [_summary(d)]
    for title, items in _sections(d, str):
        out += [f"{title}: {_count(items)}"] + [f"  {item}" for item in items or []]
    return "\n".join(out)
