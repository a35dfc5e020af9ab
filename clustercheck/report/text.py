"""The report people read: failures and warnings first with their fixes, then what passed (the same finding on
several hosts as one row naming them); the skipped checks folded into one line per reason; each stage's time; the
counts, the verdict and what to do next."""

from __future__ import annotations

import io
import re
from collections import Counter
from dataclasses import replace

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment, Segments
from rich.style import Style
from rich.text import Text

from clustercheck.model import CheckResult, Status
from clustercheck.report import CLUSTER_SUITE, SEVERITY, Report, StageSummary, duration_text

STYLES = {
    Status.PASS: "green",
    Status.WARN: "yellow",
    Status.FAIL: "bold red",
    Status.ERROR: "bold red",
    Status.SKIP: "dim",
}
NAMES_SHOWN = 8  # check names listed on a folded skip line; the JSON report has them all
HOSTS_SHOWN = 8  # hosts named on a fix line
HOSTS_FOLDED = 3  # hosts named in the host cell of a row that folds the same finding on several hosts
REASON_CHARS = 100  # of why a stage did not run, on the stages line (the skip lines have it whole)


def print_report(report: Report, console: Console, raw_output: str | None = None) -> None:
    results = report.results
    judged = sorted((r for r in results if r.status is not Status.SKIP), key=lambda r: SEVERITY[r.status])
    if judged:
        rows = fold(judged, report.hosts)
        print_table([r for r, _ in rows], console, [where for _, where in rows])
    lines = [f"[bold]fix[/] {escape(line)}" for line in fix_lines(judged)]
    lines += [f"[dim]{escape(line)}[/]" for line in skipped_lines(results, report.hosts)]
    if report.stages:
        lines.append(escape(stages_line(report.stages)))
    lines.append(escape(counts_line(report, raw_output)))
    lines.append(f"[bold]{escape(report.verdict)}[/]")
    lines.append(f"next: {escape(report.next_step)}")
    # One print, without rich's highlighting of numbers and paths: on a cluster's hundreds of lines both cost more
    # than the rest of the report; what matters is styled where it is written.
    console.print("\n".join(lines), highlight=False)


COLUMNS = ("status", "check", "host", "message")
# The table's frame, as rich draws its tables (box.HEAVY_HEAD): top, header, below the header, rows, bottom.
TOP, HEAD, RULE, ROW, BOTTOM = "┏━┳┓", "┃ ┃┃", "┡━╇┩", "│ ││", "└─┴┘"


def fold(results: list[CheckResult], hosts: list[str]) -> list[tuple[CheckResult, str]]:
    """One row per finding: a check that says the same (status and message) on several hosts is one row naming
    them, in the order given, so a cluster of a thousand nodes is not a thousand rows of the same line; so is a
    check that passed with more than HOSTS_SHOWN different messages. Each row
    is its first result and the host cell: the host, the cluster, or the hosts (`all N hosts`, or the first few
    and how many more)."""
    groups: dict[tuple, list[CheckResult]] = {}
    for i, r in enumerate(results):
        if r.host is None:
            groups[(i,)] = [r]  # a cluster-wide result is its own row
            continue
        groups.setdefault((r.status, r.name, r.message.removeprefix(f"{r.host}: ")), []).append(r)
    # A check that passed saying something of its own on each host (its name, its address) is one row once it
    # would take more than HOSTS_SHOWN rows: the first host's message stands for them, the JSON report has each.
    passing = Counter(key[1] for key in groups if key[0] is Status.PASS)
    merged: dict[tuple, list[CheckResult]] = {}
    for key, members in groups.items():
        many = len(key) > 1 and key[0] is Status.PASS and passing[key[1]] > HOSTS_SHOWN
        merged.setdefault(("passed", key[1]) if many else key, []).extend(members)
    rows = []
    for key, members in merged.items():
        first = members[0]
        if key[0] == "passed":
            first = replace(first, message=f"{first.message} (each host's own message: the JSON report)")
        where = list(dict.fromkeys(r.host or CLUSTER_SUITE for r in members))
        if len(where) == 1:
            rows.append((first, where[0]))
        elif len(where) == len(hosts) and set(where) == set(hosts):
            rows.append((first, f"all {len(where)} hosts"))
        else:
            shown = ", ".join(where[:HOSTS_FOLDED])
            rows.append(
                (first, shown + (f" and {len(where) - HOSTS_FOLDED} more" if len(where) > HOSTS_FOLDED else ""))
            )
    return rows


def print_table(results: list[CheckResult], console: Console, hosts: list[str] | None = None) -> None:
    """RESULTS as a table; HOSTS: each row's host cell (fold()), else each result's own host."""
    segments: list[Segment] = []
    styles: dict[str, Style] = {}
    for line in table_lines(results, console.width, hosts):
        for piece, name in line:
            style = styles.setdefault(name, console.get_style(name)) if name else None
            segments.append(Segment(piece, style))
        segments.append(Segment.line())
    console.print(Segments(segments), soft_wrap=True)  # laid out already: rich writes the pieces as they are


Line = list[tuple[str, str | None]]  # a line of the table: its pieces, each with its style's name (or none)


def table_lines(results: list[CheckResult], width: int, hosts: list[str] | None = None) -> list[Line]:
    """The results as a table WIDTH columns wide at most, the status coloured: a border, one row per result,
    long cells wrapped within their column (a word longer than its column folded). Laid out in one pass over the
    rows: rich's own Table measures and renders every cell through its layout engine several times, and on a
    cluster's hundreds of rows it cost clustercheck more CPU than talking to the nodes did."""
    cells = hosts if hosts is not None else [r.host or CLUSTER_SUITE for r in results]
    rows = [
        (
            r.status.value,
            r.name,
            where,
            r.message.removeprefix(f"{r.host}: ") if r.host else r.message,  # the host has its own column
        )
        for r, where in zip(results, cells, strict=True)
    ]
    widths = column_widths([COLUMNS, *rows], width)
    lines: list[Line] = [[(_rule(TOP, widths), None)]]
    last = len(widths) - 1

    def add(cells: tuple[str, ...], frame: str, styles: tuple[str | None, ...]) -> None:
        wrapped = [_wrap(cell, w) for cell, w in zip(cells, widths, strict=True)]
        for i in range(max(len(w) for w in wrapped)):
            line: Line = []
            plain = frame[0]
            for column, (parts, w) in enumerate(zip(wrapped, widths, strict=True)):
                part = parts[i] if i < len(parts) else ""
                after = " " * (w - _width(part) + 1) + (frame[3] if column == last else frame[2])
                if styles[column] and part:
                    line += [(plain + " ", None), (part, styles[column])]
                    plain = after
                else:
                    plain += f" {part}{after}"
            lines.append([*line, (plain, None)])

    add(COLUMNS, HEAD, ("table.header",) * len(COLUMNS))
    lines.append([(_rule(RULE, widths), None)])
    for row, r in zip(rows, results, strict=True):
        add(row, ROW, (STYLES[r.status], None, None, None))
    lines.append([(_rule(BOTTOM, widths), None)])
    return lines


def column_widths(rows: list[tuple[str, ...]], width: int) -> list[int]:
    """Each column's width (its widest cell), the widest columns narrowed first until the table, with a space on
    either side of every cell and the borders, fits within WIDTH."""
    widths = [
        max(max((_width(line) for line in cell.split("\n")), default=0) for cell in column)
        for column in zip(*rows, strict=True)
    ]
    excess = sum(widths) + 3 * len(widths) + 1 - width
    while excess > 0:
        widest = max(widths)
        if widest <= 1:
            break
        below = max((w for w in widths if w < widest), default=0)
        at = [i for i, w in enumerate(widths) if w == widest]
        step = max(1, min(widest - max(below, 1), -(-excess // len(at))))
        for i in at:
            cut = min(step, excess)
            widths[i] -= cut
            excess -= cut
            if not excess:
                break
    return widths


def _rule(frame: str, widths: list[int]) -> str:
    return frame[0] + frame[2].join(frame[1] * (w + 2) for w in widths) + frame[3]


def _width(text: str) -> int:
    return len(text) if text.isascii() else cell_len(text)


def _wrap(cell: str, width: int) -> list[str]:
    """CELL's lines within WIDTH: its own lines, each wrapped at spaces, a longer word folded."""
    lines: list[str] = []
    for paragraph in cell.split("\n"):
        if _width(paragraph) <= width:
            lines.append(paragraph)
        elif paragraph.isascii():
            lines += _wrap_words(paragraph, width)
        else:  # wide characters: rich knows their cells
            lines += [line.plain.rstrip() for line in Text(paragraph).wrap(_CONSOLE, width, overflow="fold")]
    return lines


def _wrap_words(paragraph: str, width: int) -> list[str]:
    """An ASCII PARAGRAPH wrapped as rich wraps text: a word that does not fit starts the next line; a word wider
    than the column is folded, its last piece continuing the line."""
    lines, line = [], ""
    for word in WORDS.findall(paragraph):
        bare = word.rstrip()
        if len(line) + len(bare) <= width:
            line += word
        elif len(bare) > width:
            pieces = [word[i : i + width] for i in range(0, len(word), width)]
            lines += ([line] if line else []) + pieces[:-1]
            line = pieces[-1]
        else:
            lines.append(line)
            line = word
    lines.append(line)
    return [line.rstrip() for line in lines]


WORDS = re.compile(r"\s*\S+\s*")
_CONSOLE = Console(width=1 << 16, color_system=None)


def result_lines(results: list[CheckResult], hosts: list[str] | None = None) -> list[str]:
    """One line per result that judged something, in the order given: `STATUS  check  message` (node-health's
    output, which a health program's log keeps line by line); then the SKIPs folded into one line per reason, as
    `run` shows them: `SKIP  29 skipped: no NVIDIA GPU on this node (none expected) (torch.*, gpu.*, ...)`."""
    judged = [r for r in results if r.skip is None]
    width = max((len(r.name) for r in judged), default=0)
    lines = []
    for r in judged:
        message = r.message.removeprefix(f"{r.host}: ") if r.host else r.message
        lines.append(f"{r.status.value:<5} {r.name:<{width}}  {' '.join(message.split())}")
    hosts = hosts if hosts is not None else sorted({r.host for r in results if r.host})
    return lines + [f"{Status.SKIP.value:<5} {line}" for line in skipped_lines(results, hosts)]


def fix_lines(results: list[CheckResult]) -> list[str]:
    """The fixes of what warned or failed, in the order given: one line per fix, naming every check that gives it and
    every host that needs it (the same fix on every node, or of several checks, is one line, not one per node or
    per check)."""
    named: dict[str, tuple[list[str], list[str]]] = {}
    for r in results:
        if r.status in (Status.WARN, Status.FAIL, Status.ERROR) and r.remediation:
            checks, where = named.setdefault(r.remediation, ([], []))
            if r.name not in checks:
                checks.append(r.name)
            if r.host and r.host not in where:
                where.append(r.host)
    lines = []
    for fix, (checks, where) in named.items():
        shown = ", ".join(where[:HOSTS_SHOWN]) + (
            f" and {len(where) - HOSTS_SHOWN} more" if len(where) > HOSTS_SHOWN else ""
        )
        lines.append(f"{', '.join(checks)}{' on ' + shown if where else ''}: {fix}")
    return lines


def skipped_lines(results: list[CheckResult], hosts: list[str]) -> list[str]:
    """One line per reason a check was skipped (each SKIP's own, as data): how many results, the reason, which
    checks, and on which hosts where not on all of them."""
    groups: dict[str, list[CheckResult]] = {}
    for r in results:
        if r.skip is not None:
            groups.setdefault(r.skip.reason, []).append(r)
    lines = []
    for reason, members in groups.items():
        names = _names(list(dict.fromkeys(r.name for r in members)))
        where = sorted({r.host for r in members if r.host})
        on = f" on {', '.join(where)}" if where and len(hosts) > 1 and set(where) != set(hosts) else ""
        lines.append(f"{len(members)} skipped: {reason} ({names}{on})")
    return lines


def _names(names: list[str]) -> str:
    """Check names, those sharing a prefix with others as `prefix.*`: gpu.*, pcie.*, torch.cuda."""
    prefixes = Counter(n.split(".", 1)[0] for n in names if "." in n)
    folded = (f"{n.split('.', 1)[0]}.*" if prefixes.get(n.split(".", 1)[0], 0) > 1 else n for n in names)
    shown = list(dict.fromkeys(folded))
    more = f" and {len(shown) - NAMES_SHOWN} more" if len(shown) > NAMES_SHOWN else ""
    return ", ".join(shown[:NAMES_SHOWN]) + more


def stages_line(stages: list[StageSummary]) -> str:
    """Each stage with its outcome and time; the stages that did not run, grouped by why."""
    parts = []
    skipped: dict[str, list[str]] = {}
    for s in stages:
        if s.verified:
            took = f" in {duration_text(s.duration_s)}" if s.duration_s is not None else ""
            parts.append(f"{s.name} {s.status.value}{took}")
        else:
            skipped.setdefault(s.skipped or "", []).append(s.name)
    for why, names in skipped.items():
        why = why if len(why) <= REASON_CHARS else why[: REASON_CHARS - 1] + "…"
        parts.append(f"{', '.join(names)} skipped ({why})")
    return "stages: " + " · ".join(parts)


def counts_line(report: Report, raw_output: str | None = None) -> str:
    counts = Counter(r.status for r in report.results)
    summary = ", ".join(f"{counts[s]} {s.value}" for s in sorted(counts, key=SEVERITY.get)) or "none"
    parts = [f"{len(report.results)} result(s): {summary}", f"{len(report.hosts)} host(s)"]
    if report.duration_s is not None:
        parts.append(f"took {duration_text(report.duration_s)}")
    if raw_output:
        parts.append(f"raw output: {raw_output}")
    return " · ".join(parts)


def render(report: Report) -> str:
    """The report as plain text (for -o FILE)."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    print_report(report, console)
    return buffer.getvalue().rstrip("\n")
