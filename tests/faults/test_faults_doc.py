"""docs/faults.md is the fault suite's table: the same rows in the same order, the same injections and exit codes,
and every recorded first line matching what its row expects. Needs no cluster."""

from __future__ import annotations

import re
from pathlib import Path

from fault_rows import ROWS

DOC = Path(__file__).resolve().parent.parent.parent / "docs" / "faults.md"


def table_rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        if not re.match(r"\| \d+ \|", line):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append(cells)
    return rows


def test_the_published_table_is_the_suites_rows():
    published = table_rows()
    assert [cells[1] for cells in published] == [r.fault for r in ROWS], "regenerate: scripts/faults_docs.py"
    for number, (cells, row) in enumerate(zip(published, ROWS, strict=True), 1):
        assert cells[0] == str(number)
        assert cells[2] == row.injection, f"{row.id}: regenerate docs/faults.md (scripts/faults_docs.py)"
        said = cells[3].strip("`")
        assert re.search(row.cause, said), f"{row.id}: the recorded {said!r} does not match {row.cause!r}"
        assert cells[4] == (
            f"`{row.check}` ({row.where})"
            if row.check
            else ("(none: interrupted)" if row.mid_run else "(none: refused, no report)")
        )
        assert cells[5] == str(int(row.exit_code))
        seconds = float(cells[6].split()[0])
        assert seconds <= row.deadline, f"{row.id}: recorded {seconds} s, over its deadline of {row.deadline} s"
