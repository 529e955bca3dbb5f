"""Statistics for accuracy checks, with the standard library only (no scipy at runtime).

- Wilson score interval for a binomial proportion (what docs/protocols.md asks for: it behaves well
  near 0 and 1, where accuracies of optimised stacks live, unlike the normal approximation).
- McNemar's exact test for paired outcomes: the discordant pairs b and c are a binomial with
  n = b + c and p = 0.5 under "no difference"; two-sided p as scipy.stats.binomtest gives it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Two-sided 95%: the 0.975 quantile of the standard normal (scipy.special.ndtri(0.975)).
Z_95 = 1.959963984540054


@dataclass(frozen=True)
class Proportion:
    """k successes out of n, with its Wilson interval."""

    k: int
    n: int
    low: float
    high: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else 0.0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def as_dict(self) -> dict[str, float | int]:
        return {"k": self.k, "n": self.n, "value": self.value, "ci95_low": self.low, "ci95_high": self.high}


def wilson_interval(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval (no continuity correction). n = 0 gives the whole range (0, 1)."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    # Clamp tiny float excursions; at k = 0 or k = n one end is exactly 0 or 1.
    low = 0.0 if k == 0 else max(0.0, center - half)
    high = 1.0 if k == n else min(1.0, center + half)
    return low, high


def proportion(k: int, n: int, z: float = Z_95) -> Proportion:
    low, high = wilson_interval(k, n, z)
    return Proportion(k=k, n=n, low=low, high=high)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts b and c.

    Under the null each discordant pair falls either way with probability 1/2, so
    p = min(1, 2 * P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2). Integer arithmetic
    keeps it exact for any n GSM8K can produce.
    """
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b}, c={c}")
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1))
    return min(1.0, 2 * tail / (1 << n))
