"""The acceptance rule on simulated samples: false "faster" on A/A, and detection power.

Block medians are simulated as log-normal around the true time, with per-block noise of 0.5–2 %:
a pessimistic multiple of what the harness measured on an H200 (bench/harness/README.md, run 5:
the standard deviation of the paired log speedups was 0.08–0.12 % in the median comparison and
0.31 % at most, over 150 A/A comparisons).
"""

from __future__ import annotations

import numpy as np
import pytest

from kernelabd.harness.accept import aa_noise, decide

TRIALS = 1000
PAIRS = 10
MIN_GAIN = 0.01


def simulate(rng: np.random.Generator, speedup: float, noise: float,
             pairs: int = PAIRS) -> tuple[list[float], list[float]]:
    drift = np.cumsum(rng.normal(0, noise / 3, pairs))          # slow clock/thermal drift
    a = 1.0 * np.exp(drift + rng.normal(0, noise, pairs))
    b = (1.0 / speedup) * np.exp(drift + rng.normal(0, noise, pairs))
    return list(a), list(b)


@pytest.mark.parametrize("noise", [0.005, 0.02])
def test_aa_false_faster_at_most_one_percent(noise: float) -> None:
    rng = np.random.default_rng(1234)
    false = sum(decide(*simulate(rng, 1.0, noise), MIN_GAIN, seed=i).faster for i in range(TRIALS))
    assert false / TRIALS <= 0.01, f"{false} false 'faster' in {TRIALS} A/A comparisons"


@pytest.mark.parametrize("noise", [0.005, 0.01])
def test_true_five_percent_gain_detected(noise: float) -> None:
    rng = np.random.default_rng(99)
    hits = sum(decide(*simulate(rng, 1.05, noise), MIN_GAIN, seed=i).faster for i in range(TRIALS))
    assert hits / TRIALS >= 0.95, f"detected {hits}/{TRIALS} true 5% gains at {noise:.1%} noise"


def test_slower_candidate_never_faster() -> None:
    rng = np.random.default_rng(7)
    assert not any(decide(*simulate(rng, 0.9, 0.01), MIN_GAIN, seed=i).faster for i in range(200))


def test_gain_below_min_gain_is_not_kept_even_without_noise() -> None:
    d = decide([1.0] * 8, [1 / 1.005] * 8, MIN_GAIN)
    assert d.speedup == pytest.approx(1.005)
    assert not d.faster and d.threshold == pytest.approx(1 + MIN_GAIN)


def test_noisy_baseline_raises_the_threshold() -> None:
    rng = np.random.default_rng(3)
    a = list(np.exp(rng.normal(0, 0.08, 12)))
    assert aa_noise(a) > MIN_GAIN
    d = decide(a, [x / 1.05 for x in a], MIN_GAIN)
    assert d.threshold > 1 + MIN_GAIN
    assert d.ci[0] <= d.speedup <= d.ci[1]


def test_unpaired_blocks_are_refused() -> None:
    with pytest.raises(ValueError):
        decide([1.0, 1.0], [1.0], MIN_GAIN)
