"""Turn the collective worker's per-rank records into checks (pure logic, no I/O)."""

from __future__ import annotations

from clustercheck.model import CheckResult, Status

COLLECTIVES = ("allreduce", "allgather", "broadcast")


def evaluate(records: list[dict], world_size: int) -> list[CheckResult]:
    """One check per collective: PASS when every rank reported zero wrong elements."""
    failed = [r for r in records if not r.get("ok")]
    missing = sorted(set(range(world_size)) - {r["rank"] for r in records})
    results = []
    for name in COLLECTIVES:
        if failed or missing:
            first = failed[0] if failed else None
            cause = (
                f"rank {first['rank']} on {first['host']}: {first.get('error', 'unknown error')}"
                if first
                else f"no result from rank(s) {', '.join(map(str, missing))}"
            )
            results.append(
                CheckResult(
                    name=name,
                    status=Status.FAIL,
                    message=f"{name} did not complete: {cause}",
                    remediation="Look at the worker's output in the run directory; check that torch imports and "
                    "that the ranks can reach each other.",
                    data={
                        "world_size": world_size,
                        "failed_ranks": [r["rank"] for r in failed],
                        "missing_ranks": missing,
                    },
                )
            )
            continue
        wrong = {r["rank"]: r["checks"][name]["wrong"] for r in records}
        total_wrong = sum(wrong.values())
        elements = records[0]["checks"][name]["elements"]
        data = {
            "world_size": world_size,
            "backend": records[0].get("backend"),
            "elements": elements,
            "wrong": total_wrong,
            "wrong_by_rank": wrong,
        }
        if total_wrong:
            bad = ", ".join(f"rank {r}: {w}" for r, w in sorted(wrong.items()) if w)
            results.append(
                CheckResult(
                    name=name,
                    status=Status.FAIL,
                    message=f"{name} returned wrong values (#wrong {bad})",
                    remediation="Wrong results from a collective point at faulty hardware or a broken "
                    "NCCL/driver install; rerun and compare nodes.",
                    data=data,
                )
            )
        else:
            results.append(
                CheckResult(
                    name=name,
                    status=Status.PASS,
                    message=f"{name} correct on {world_size} ranks ({elements} elements, #wrong 0)",
                    data=data,
                )
            )
    return results
