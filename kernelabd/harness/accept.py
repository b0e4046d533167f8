"""The acceptance rule: is B faster than A by more than the noise? A pure function of samples.

Measurement (``timing``) and decision (here) are kept apart, as nvbench and Triton's
``testing`` do, so that the rule can be tested on simulated samples by the thousand.

Samples arrive as interleaved A/B blocks; each block is summarised by its median, and each
adjacent (A, B) pair gives one log speedup. Pairing cancels slow drift (clocks, temperature)
that would bias a comparison of two separate runs. The speedup is the geometric mean of the
pair ratios with a bootstrap confidence interval; B is kept only when the whole interval lies
above ``1 + max(min_gain, A/A noise)``, where the A/A noise is how far apart A's own blocks are
measured to be under the same bootstrap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_PAIRS = 5           # fewer block pairs never make a candidate "faster"


@dataclass
class Decision:
    speedup: float
    ci: tuple[float, float]
    aa_noise: float
    threshold: float
    faster: bool

    @property
    def rel_halfwidth(self) -> float:
        return (self.ci[1] - self.ci[0]) / (2 * self.speedup)


def _mean_ci(logs: np.ndarray, seed: int) -> tuple[float, float]:
    """Bootstrap CI of the mean, widened for small samples (the "expanded percentile" interval).

    A plain percentile bootstrap of a mean is too narrow with few blocks (with 5 it covers
    ~85 % instead of 95 %). Its half-widths are scaled by ``t_{n-1} / z · sqrt(n / (n-1))``,
    Hesterberg's correction (The American Statistician 69(4), 2015), which restores coverage.
    """
    n = len(logs)
    if n < 2 or float(np.ptp(logs)) == 0.0:
        value = float(logs.mean()) if n else 0.0
        return value, value
    kwargs = {"confidence_level": CONFIDENCE, "n_resamples": RESAMPLES, "method": "percentile"}
    try:
        res = stats.bootstrap((logs,), np.mean, rng=np.random.default_rng(seed), **kwargs)
    except TypeError:  # scipy < 1.15 names the generator random_state
        res = stats.bootstrap((logs,), np.mean, random_state=np.random.default_rng(seed), **kwargs)
    centre = float(logs.mean())
    q = 0.5 + CONFIDENCE / 2
    expand = float(stats.t.ppf(q, n - 1) / stats.norm.ppf(q)) * math.sqrt(n / (n - 1))
    lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    return centre - expand * (centre - lo), centre + expand * (hi - centre)


def aa_noise(a_blocks: list[float], seed: int = 1) -> float:
    """Relative half-width of the CI of A against itself (adjacent A blocks paired)."""
    a = np.asarray(a_blocks, dtype=float)
    if len(a) < 4:
        return float(np.std(a) / np.mean(a)) if len(a) > 1 else 0.0
    n = len(a) // 2 * 2
    logs = np.log(a[0:n:2] / a[1:n:2])
    lo, hi = _mean_ci(logs, seed)
    return (math.exp(hi) - math.exp(lo)) / 2


def decide(a_blocks: list[float], b_blocks: list[float], min_gain: float, seed: int = 0) -> Decision:
    """Decide from paired block medians (``a_blocks[i]`` was measured next to ``b_blocks[i]``)."""
    if len(a_blocks) != len(b_blocks) or not a_blocks:
        raise ValueError("need the same non-zero number of A and B blocks")
    a = np.asarray(a_blocks, dtype=float)
    b = np.asarray(b_blocks, dtype=float)
    logs = np.log(a / b)
    lo, hi = _mean_ci(logs, seed)
    noise = aa_noise(a_blocks, seed + 1)
    threshold = 1.0 + max(min_gain, noise)
    ci = (math.exp(lo), math.exp(hi))
    return Decision(speedup=math.exp(float(logs.mean())), ci=ci, aa_noise=noise,
                    threshold=threshold, faster=len(logs) >= MIN_PAIRS and ci[0] > threshold)
