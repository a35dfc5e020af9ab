"""Reports: one module per output format, each `render(report) -> str`, chosen by `--format`.

Adding a format means adding a module with a `render` function and listing it in FORMAT_NAMES and
`_formats`; the CLI's `--format` choices come from here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

from clustercheck.model import CheckResult, Status, overall_status

SCHEMA_VERSION = 1
CLUSTER_SUITE = "(cluster)"  # where a cluster-wide check (host None) is listed


@dataclass(frozen=True)
class Report:
    """What one `clustercheck run` found, as every format renders it."""

    results: list[CheckResult]
    hosts: list[str]
    run_id: str | None = None  # CLUSTERCHECK_RUN=<run_id> marks this run's processes on the nodes
    started_at: float | None = None  # Unix time the run started
    duration_s: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def status(self) -> Status:
        return overall_status(self.results)


def verdict(results: list[CheckResult]) -> str:
    status = overall_status(results)
    if status is Status.FAIL:
        bad = sum(1 for r in results if r.status.is_problem)
        return f"NOT READY: {bad} check(s) failed"
    return "READY for multi-node PyTorch" + (" (with warnings)" if status is Status.WARN else "")


def _formats() -> dict[str, Callable[[Report], str]]:
    from clustercheck.report import json, junit, markdown, prometheus, text

    return {
        "text": text.render,
        "json": json.render,
        "junit": junit.render,
        "markdown": markdown.render,
        "prometheus": prometheus.render,
    }


FORMAT_NAMES = ("text", "json", "junit", "markdown", "prometheus")


def render(report: Report, fmt: str) -> str:
    return _formats()[fmt](report)


def schema_text() -> str:
    """The JSON Schema of the JSON report (shipped in the package; `clustercheck schema` prints it)."""
    from importlib.resources import files

    return files(__package__).joinpath("report.schema.json").read_text()


def write_atomic(path, content: str) -> None:
    """Write CONTENT to PATH through a temporary file in the same directory and a rename, so a reader (a
    monitoring agent, a CI step) never sees half a report."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
