"""Turn the all_reduce bandwidth sweep into checks (pure logic, no I/O).

Numbers speak nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n, in GB/s (10^9 bytes per second),
where time is the slowest rank's mean time per all_reduce call. The check compares the peak busbw of the
sweep (in practice the largest messages) with the user's thresholds.
"""

from __future__ import annotations

from dataclasses import dataclass

from clustercheck.model import CheckResult, Status


class ThresholdError(ValueError):
    """A --min-busbw value that cannot be read; printed as one line."""


@dataclass(frozen=True)
class Thresholds:
    fail_below: float | None = None  # GB/s busbw
    warn_below: float | None = None

    def judge(self, busbw: float) -> Status:
        if self.fail_below is not None and busbw < self.fail_below:
            return Status.FAIL
        if self.warn_below is not None and busbw < self.warn_below:
            return Status.WARN
        return Status.PASS

    def describe(self) -> str:
        parts = []
        if self.fail_below is not None:
            parts.append(f"FAIL below {self.fail_below:g}")
        if self.warn_below is not None:
            parts.append(f"WARN below {self.warn_below:g}")
        return ", ".join(parts) + " GB/s" if parts else "no threshold"


def parse_min_busbw(text: str | float | None) -> Thresholds:
    """`--min-busbw FAIL[:WARN]` in GB/s, e.g. `40` (FAIL under 40) or `40:80` (also WARN under 80).

    The same text is accepted from the inventory variable clustercheck_min_busbw.
    """
    if text is None or text == "":
        return Thresholds()
    if isinstance(text, int | float):
        return Thresholds(fail_below=float(text))
    fail_text, _, warn_text = str(text).partition(":")
    try:
        fail = float(fail_text) if fail_text.strip() else None
        warn = float(warn_text) if warn_text.strip() else None
    except ValueError:
        raise ThresholdError(f"--min-busbw {text!r}: expected GB/s as FAIL or FAIL:WARN, e.g. 40 or 40:80") from None
    if any(v is not None and v < 0 for v in (fail, warn)):
        raise ThresholdError(f"--min-busbw {text!r}: bandwidth cannot be negative")
    if fail is not None and warn is not None and warn < fail:
        raise ThresholdError(f"--min-busbw {text!r}: the WARN level must not be below the FAIL level")
    return Thresholds(fail_below=fail, warn_below=warn)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def peak(rows: list[dict]) -> dict:
    return max(rows, key=lambda row: row["busbw_gbps"])


def _check(name: str, host: str | None, scope: str, rows: list[dict], ranks: int, backend, thresholds) -> CheckResult:
    best = peak(rows)
    status = thresholds.judge(best["busbw_gbps"])
    table = ", ".join(f"{_size(r['bytes'])}: {r['busbw_gbps']:.3g}" for r in rows)
    message = (
        f"{scope} all_reduce busbw peak {best['busbw_gbps']:.3g} GB/s at {_size(best['bytes'])} over {ranks} ranks"
        f" ({backend}); busbw by size in GB/s: {table}"
    )
    if status is not Status.PASS:
        message = (
            f"{scope} all_reduce busbw {best['busbw_gbps']:.3g} GB/s is under the threshold ({thresholds.describe()})"
        )
    remediation = ""
    if status is not Status.PASS:
        remediation = (
            "Check that NCCL uses the fast interconnect (NCCL_DEBUG=INFO output in the run directory: look for "
            "NET/IB or NVLink rather than NET/Socket), the link speed (`ethtool`, `ibstat`), the MTU, and that "
            "NCCL_SOCKET_IFNAME names the cluster interface."
        )
    return CheckResult(
        name,
        status,
        message,
        host=host,
        remediation=remediation,
        data={
            "ranks": ranks,
            "backend": backend,
            "peak_busbw_gbps": best["busbw_gbps"],
            "peak_bytes": best["bytes"],
            "sizes": rows,
            "thresholds": {"fail_below": thresholds.fail_below, "warn_below": thresholds.warn_below},
        },
    )


def evaluate(records: list[dict], world_size: int, thresholds: Thresholds | None = None) -> list[CheckResult]:
    """`allreduce.bandwidth` for the whole job, and `allreduce.bandwidth.intra_node` per node when measured."""
    thresholds = thresholds or Thresholds()
    first = next((r for r in records if r.get("rank") == 0), None)
    if first is None or not first.get("ok") or "bandwidth" not in first:
        why = "the collectives job did not complete" if first is None or not first.get("ok") else "sweep not run"
        return [CheckResult("allreduce.bandwidth", Status.SKIP, f"no bandwidth results: {why}")]
    backend = first.get("backend")
    results = [
        _check("allreduce.bandwidth", None, "cluster", first["bandwidth"]["world"], world_size, backend, thresholds)
    ]
    for record in sorted(records, key=lambda r: r["rank"]):
        intra = (record.get("bandwidth") or {}).get("intra_node")
        if not intra or record["rank"] != intra["ranks"][0]:
            continue  # one report per node, from its first rank
        results.append(
            _check(
                "allreduce.bandwidth.intra_node",
                record["host"],
                f"{record['host']}: intra-node",
                intra["results"],
                len(intra["ranks"]),
                backend,
                thresholds,
            )
        )
    return results
