"""An earlier JSON report read back (`run --baseline`, `diff`): checked against the published schema
(report.schema.json), so a comparison never reads a file that is not one of clustercheck's reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from clustercheck.report import SCHEMA_VERSION, schema_text


class ReportError(ValueError):
    """A file that cannot be read as a clustercheck JSON report; its message is one line naming the file."""


def load(path: str | Path) -> dict[str, Any]:
    """The JSON report at PATH, validated; ReportError (one line) when it is missing, not JSON, of another schema
    version, or does not match the schema."""
    import jsonschema

    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ReportError(f"{path}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise ReportError(f"{path}: not a clustercheck report (a JSON {type(document).__name__}, not an object)")
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ReportError(
            f"{path}: schema_version {version!r}, this clustercheck reads schema_version {SCHEMA_VERSION} "
            "(clustercheck run --format json writes it)"
        )
    validator = jsonschema.Draft202012Validator(json.loads(schema_text()))
    error = jsonschema.exceptions.best_match(validator.iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "the top level"
        message = " ".join(error.message.split())
        message = message if len(message) <= 160 else message[:157] + "..."
        raise ReportError(f"{path}: not a clustercheck report: at {where}: {message}")
    return document
