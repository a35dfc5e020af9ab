"""gpu.xid: the NVIDIA driver's Xid lines of the kernel log, each judged by NVIDIA's Xid catalog (xid_catalog.py),
and only those the GPU has not left behind.

By whose rule:
- What an Xid calls for is NVIDIA's Resolution Bucket (Immediate Action) in its Xid catalog, with clustercheck's
  action beside it (the catalog file says where and why they differ); a site overrides it per code in its
  inventory (clustercheck_xid_actions). Xid 154 carries the recovery it needs in its own line.
- From when an Xid counts is clustercheck's rule, on what the node can tell (facts/xidlog.py): an Xid logged before
  the driver's last load, or before its GPU's last reset, was dealt with (a reload initialises every GPU anew, a
  reset that one), so it is listed as history and not judged. No kernel line that marks `nvidia-smi -r` was found;
  a reset counts where its acknowledgement was logged as NVIDIA's NVSentinel logs it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from clustercheck.checks import xid_catalog
from clustercheck.checks.registry import Finding, fail, node_check, passed, warn
from clustercheck.facts import parse, xidlog
from clustercheck.facts.model import COULD_NOT_COLLECT, NodeFacts

RESET_NOTE = (
    "gpu.xid counts only Xids logged after the GPU's reset: reload the driver, or log the reset as NVIDIA's "
    'NVSentinel does: logger -t nvsentinel-gpu-reset "GPU reset executed: <GPU UUID>, success: true"'
)


@node_check(
    "gpu.xid",
    proves="no NVIDIA Xid error logged since the driver's last load (or the GPU's last reset) calls for a GPU reset, "
    "a reboot or an inspection: each Xid of the kernel log (journalctl -k -b, else dmesg) judged by NVIDIA's Xid "
    "catalog, its Resolution Bucket beside clustercheck's action (FAIL for what takes the GPU out, WARN for the "
    "rest and for a code the catalog does not list, the site's clustercheck_xid_actions first); older Xids are "
    "listed as history, not judged",
    fix="Do what the message says for each Xid (NVIDIA's Xid catalog: "
    f"{xid_catalog.CATALOG_URL}); a GPU reset or a reboot needs the node drained first.",
    needs_gpu=True,
)
def gpu_xid(facts: NodeFacts) -> Finding:
    log = facts.xids
    if log is None:
        return warn(
            f"Xid lines: {COULD_NOT_COLLECT} ({facts.why_missing('xids')})",
            "Run clustercheck as a user that can read the kernel log (root, or the adm/systemd-journal group).",
        )
    text = "\n".join(log.lines)
    uuids = {g.uuid: g.bus_id for g in (facts.smi.gpus if facts.smi else []) if g.uuid}
    loads = xidlog.driver_loads(text)
    load = loads[-1] if loads else None
    current, history = split(parse.parse_xids(text), load, xidlog.gpu_resets(text, uuids))
    since = f"since the driver loaded at {load['time'] or 'a time not logged'}" if load else "since boot"
    overrides = facts.node.xid_actions
    if not current:
        older = f"; older, not judged: {history_words(history)}" if history else ""
        data = {"source": log.source, "history": history_data(history)}
        return passed(f"no Xid {since} ({log.source}, {log.read} line(s) read){older}", **data)
    return judge_xids(current, log.source, since, overrides=overrides, history=history)


def split(xids: list[dict], load: dict | None, resets: dict[str, dict]) -> tuple[list[dict], list[dict]]:
    """XIDS (parse.parse_xids) -> (those logged after the driver's LOAD and their GPU's last reset in RESETS, the
    older ones, each with "before": what it was left behind by)."""
    current, history = [], []
    for xid in xids:
        marks = [("the driver's load", load)] if load else []
        reset = resets.get(xidlog.pci_key(xid["pci"]))
        if reset:
            marks.append(("the GPU's reset", reset))
        later = [(what, mark) for what, mark in marks if mark["at"] > xid["at"]]
        if not later:
            current.append(xid)
            continue
        what, mark = max(later, key=lambda item: item[1]["at"])
        history.append({**xid, "before": f"{what} at {mark['time'] or 'a time not logged'}"})
    return current, history


def judge_xids(
    xids: list[dict],
    source: str,
    when: str = "since boot",
    overrides: dict[int, str] | None = None,
    history: list[dict] | None = None,
) -> Finding:
    """Each Xid code of XIDS (parse.parse_xids, logged WHEN) by the catalog, the site's OVERRIDES first: a FAIL
    naming the action when one calls for taking the GPU or the node out of service, else a WARN. HISTORY (older
    Xids, not judged) is listed after them."""
    codes: dict[int, list[dict]] = {}
    for xid in xids:
        codes.setdefault(xid["xid"], []).append(xid)
    parts, judged, serious = [], {}, []
    for code, seen in sorted(codes.items()):
        gpus = ", ".join(sorted({x["pci"] for x in seen}))
        times = f"{len(seen)} time(s) on {gpus} {logged(seen)}"
        entry = _entry(code, seen, overrides)
        if entry is None:
            parts.append(f"Xid {code} ({times}): not in clustercheck's copy of NVIDIA's Xid catalog, look it up there")
            judged[code] = {"count": len(seen), "gpus": gpus, "known": False, "logged": _times(seen)}
            continue
        parts.append(f"Xid {code} ({entry.name}; cause: {entry.cause}) {times}: {_words(entry)}")
        judged[code] = {
            "count": len(seen),
            "gpus": gpus,
            "cause": entry.cause,
            "action": entry.action,
            "nvidia": entry.nvidia_action,
            "site": entry.site,
            "logged": _times(seen),
        }
        if entry.takes_out:
            serious.append(entry)
    data: dict[str, Any] = {"xids": judged, "source": source, "last": xids[-1]["line"]}
    data.update(catalog=xid_catalog.CATALOG_VERSION, history=history_data(history or []))
    message = f"{len(xids)} Xid error(s) {when} ({source}): " + "; ".join(parts)
    if history:
        message += f"; older, not judged: {history_words(history)}"
    if serious:
        action = xid_catalog.strongest([e.action for e in serious])
        named = ", ".join(str(e.code) for e in serious if e.action == action)
        fix = f"Xid {named}: {xid_catalog.ACTION_WORDS[action]} (NVIDIA's Xid catalog, {xid_catalog.CATALOG_URL})."
        return fail(message, fix + (f" {RESET_NOTE}." if action == xid_catalog.RESET_GPU else ""), **data)
    fix = f"No Xid here calls for taking the GPU out; NVIDIA's Xid catalog: {xid_catalog.CATALOG_URL}."
    return warn(message, fix, **data)


def _entry(code: int, seen: list[dict], overrides: dict[int, str] | None) -> xid_catalog.Xid | None:
    """The catalog's entry for CODE; Xid 154's action read from the last line of each GPU (the recovery the driver
    asks for now), the strongest of them, unless the site set one."""
    entry = xid_catalog.lookup(code, overrides)
    if entry is None or code != 154 or entry.site:
        return entry
    last = {x["pci"]: x["line"] for x in seen}
    named = [found for line in last.values() if (found := xid_catalog.recovery_action(line))]
    if not named:
        return entry
    action = xid_catalog.strongest([a for a, _ in named])
    words = ", ".join(sorted({w for a, w in named if a == action}))
    return replace(entry, action=action, meaning=f"{entry.name}, to {words}", note="")


def _words(entry: xid_catalog.Xid) -> str:
    """What to do about ENTRY, and whose rule that is where it is not NVIDIA's bucket word for word."""
    words = xid_catalog.ACTION_WORDS[entry.action]
    if entry.site:
        return f"{words} (the site's action, {xid_catalog.OVERRIDE_VAR}; NVIDIA: {entry.nvidia_action})"
    return f"{words} ({entry.note})" if entry.note else words


def logged(xids: list[dict]) -> str:
    """When XIDS were logged, in the log's words: "at T", "first at T1, last at T2"."""
    times = _times(xids)
    if not times:
        return "(the log carries no time)"
    return f"at {times[0]}" if len(times) == 1 else f"first at {times[0]}, last at {times[-1]}"


def _times(xids: list[dict]) -> list[str]:
    stamps = [x.get("time") for x in xids if x.get("time")]
    return list(dict.fromkeys([stamps[0], stamps[-1]])) if stamps else []


def history_data(history: list[dict]) -> dict[int, dict[str, Any]]:
    """The older Xids, per code: how many, on which GPUs, the last one's time, what they were left behind by."""
    by_code: dict[int, dict[str, Any]] = {}
    for xid in history:
        entry = by_code.setdefault(xid["xid"], {"count": 0, "gpus": set(), "before": set()})
        entry["count"] += 1
        entry["gpus"].add(xid["pci"])
        entry["before"].add(xid["before"])
        entry["last"] = xid.get("time")
    return {
        code: {**e, "gpus": ", ".join(sorted(e["gpus"])), "before": "; ".join(sorted(e["before"]))}
        for code, e in sorted(by_code.items())
    }


def history_words(history: list[dict]) -> str:
    return "; ".join(
        f"Xid {code} {e['count']} time(s) on {e['gpus']} (last at {e['last'] or 'a time not logged'}, "
        f"before {e['before']})"
        for code, e in history_data(history).items()
    )
