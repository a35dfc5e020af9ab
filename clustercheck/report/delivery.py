"""A report built one way and delivered: what `clustercheck run`, launch's preflight and node-health found, as a
Report; the JSON and JUnit files kept in the run directory (report.json, report.xml); the format asked for, written
to -o FILE (atomically) or printed. A known extension of FILE says its format, so a .json file never holds the text
table.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from clustercheck.exitcodes import UsageError
from clustercheck.model import CheckResult
from clustercheck.report import Report, junit, render, write_atomic
from clustercheck.report import json as json_report

EXTENSIONS = {".json": "json", ".xml": "junit", ".md": "markdown", ".prom": "prometheus"}
TEXT_NAMES = ("", ".txt", ".log", ".out")  # suffixes a text report may have: the table people read
RUN_FILES = {"json": "report.json", "junit": "report.xml"}  # kept in the run directory
WRITERS = {"json": json_report.write, "junit": junit.write}  # each writes its report to a file as it renders it


def build(
    results: list[CheckResult],
    hosts: Iterable[str],
    run_id: str | None,
    started_at: float,
    *,
    durations: dict[str, float] | None = None,
    hosts_args: Iterable[str] = (),
) -> Report:
    """The report of a run over HOSTS that started at STARTED_AT (Unix time) and ends now."""
    return Report(
        results,
        list(hosts),
        run_id,
        started_at,
        time.time() - started_at,
        durations=dict(durations or {}),
        hosts_args=tuple(hosts_args),
    )


def output_format(fmt: str, given: bool, output: str | None) -> str:
    """The format the report is delivered in: FMT when the user GAVE it (--format), else the one OUTPUT's extension
    names (-o report.json: json), else FMT (text). A --format that contradicts the extension is a UsageError, and
    so is an extension no format has (-o r.csv) without --format: the text table in a .csv is no CSV."""
    suffix = Path(output).suffix.lower() if output else ""
    named = EXTENSIONS.get(suffix)
    if output and named is None and suffix not in TEXT_NAMES and not given:
        known = ", ".join(f"{s} ({f})" for s, f in EXTENSIONS.items())
        raise UsageError(
            f"-o {output}: clustercheck writes no {suffix} report: name the file {known} or .txt (text), or give "
            "--format"
        )
    if named is None or named == fmt:
        return fmt
    if given:
        raise UsageError(
            f"-o {output}: a {Path(output).suffix} file holds the {named} report, not --format {fmt}: leave --format "
            f"out, or give --format {named}"
        )
    return named


def save(report: Report, directory: Path, kinds: Iterable[str] = tuple(RUN_FILES)) -> dict[str, Path]:
    """REPORT in DIRECTORY (made when missing) in each of KINDS (report.json, report.xml), each rendered once; the
    files by kind. Each is written as it is rendered, never held whole (report/json.py's and junit.py's write)."""
    directory.mkdir(parents=True, exist_ok=True)
    saved = {kind: directory / RUN_FILES[kind] for kind in kinds}
    for kind, path in saved.items():
        with path.open("w") as out:
            WRITERS[kind](report, out)
    return saved


def deliver(
    report: Report, fmt: str, output: str | None, echo: Callable[[str], None], saved: dict[str, Path] | None = None
) -> None:
    """REPORT in FMT to OUTPUT (replaced atomically) or, without one, ECHOed; SAVED: the files already written, by
    format (save's), copied rather than rendered again."""
    done = (saved or {}).get(fmt)
    if done is not None and output:
        write_atomic(Path(output), lambda out: _copy(done, out))
    elif done is not None:
        echo(done.read_text().removesuffix("\n"))
    elif output:
        write_atomic(Path(output), render(report, fmt) + "\n")
    else:
        echo(render(report, fmt))


def _copy(path: Path, out: TextIO) -> None:
    with path.open() as source:
        shutil.copyfileobj(source, out)
