"""A measured figure's noise, from its repetitions (pure, no I/O): the median and the interquartile range, as
torch.utils.benchmark's Measurement summarises repeated timings (its median, and its IQR from the 25th and 75th
percentiles with linear interpolation, torch.quantile's default). The figures a baseline compares (the all_reduce
sweep's busbw per message size, the DDP step time) carry one in the report's check data (`spread`), so that a
comparison allows for the noise of both runs (checks/baseline_compare.py).

torch.utils.benchmark warns when the IQR is more than 10 % of the median ("this could indicate system fluctuation")
and, past 25 %, "this suggests significant environmental influence" (_IQR_WARN_THRESHOLD, _IQR_GROSS_WARN_THRESHOLD
in torch/utils/benchmark/utils/common.py); NOISY is the second.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOISY = 0.25  # IQR over the median past which a figure is too noisy to judge: torch.utils.benchmark's gross warning


def quantile(ordered: list[float], q: float) -> float:
    """The Q quantile of the sorted values ORDERED, interpolated linearly (torch.quantile's and numpy's default)."""
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class Spread:
    """The median of a figure's repetitions, its quartiles, its extremes and how many there were."""

    median: float
    p25: float
    p75: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        """The spread of VALUES (the repetitions); None without any."""
        ordered = sorted(float(v) for v in values)
        if not ordered:
            return None
        return cls(
            quantile(ordered, 0.5),
            quantile(ordered, 0.25),
            quantile(ordered, 0.75),
            ordered[0],
            ordered[-1],
            len(ordered),
        )

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    @property
    def relative(self) -> float:
        """The IQR over the median (torch.utils.benchmark's measure of a measurement's confidence)."""
        return self.iqr / abs(self.median) if self.median else 0.0

    @property
    def noisy(self) -> bool:
        return self.relative > NOISY

    def to_dict(self) -> dict[str, Any]:
        """As the report's check data holds it."""
        return {"median": self.median, "p25": self.p25, "p75": self.p75, "min": self.low, "max": self.high, "n": self.n}

    @classmethod
    def from_dict(cls, data: Any) -> Spread | None:
        """A spread read back from a report (None when there is none, or it is not one: an older report's)."""
        if not isinstance(data, dict):
            return None
        try:
            values = [float(data[k]) for k in ("median", "p25", "p75", "min", "max")]
            n = int(data["n"])
        except (KeyError, TypeError, ValueError):
            return None
        return cls(*values, n)
