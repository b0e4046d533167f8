"""The stopping rule of a timing comparison on simulated samples and a simulated clock: when it
stops decides how long every candidate holds the device and how sure its verdict is."""

from __future__ import annotations

import numpy as np

from kernelabd.config import TimingConfig
from kernelabd.harness import accept
from kernelabd.harness.timing import MAX_PAIRS, StoppingRule

CFG = TimingConfig(budget_s=8.0, target_rel_noise=0.005, min_pairs=6)


class Clock:
    """Seconds that pass only when the test advances them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pairs_until_stop(noise: float, pair_s: float, cfg: TimingConfig = CFG, seed: int = 0,
                     speedup: float = 1.0) -> tuple[StoppingRule, float]:
    """Feed log-normal block medians (``noise`` per block) until the rule stops; the rule and
    the simulated seconds it took."""
    rng = np.random.default_rng(seed)
    clock = Clock()
    rule = StoppingRule(cfg, clock)
    while True:
        clock.now += pair_s
        a, b = np.exp(rng.normal(0, noise, 2)) * (1.0, 1.0 / speedup)
        rule.add((float(a), float(b)))
        if rule.finished():
            return rule, clock.now


def test_quiet_samples_stop_at_the_minimum_pairs_well_within_budget() -> None:
    rule, took = pairs_until_stop(noise=0.0005, pair_s=0.1)
    assert len(rule.a_ms) == max(accept.MIN_PAIRS, CFG.min_pairs)
    assert rule.decision().rel_halfwidth <= CFG.target_rel_noise
    assert took < CFG.budget_s


def test_noisy_samples_run_to_the_budget_then_stop() -> None:
    rule, took = pairs_until_stop(noise=0.05, pair_s=0.1)
    assert rule.decision().rel_halfwidth > CFG.target_rel_noise, "never tight enough"
    assert CFG.budget_s < took <= CFG.budget_s + 0.1, "stops at the first pair past the budget"
    assert len(rule.a_ms) == round(took / 0.1)


def test_slow_pairs_get_min_pairs_but_never_more_than_three_budgets() -> None:
    rule, took = pairs_until_stop(noise=0.05, pair_s=2.0)
    assert len(rule.a_ms) == CFG.min_pairs and took == 2.0 * CFG.min_pairs, \
        "past the budget it still waits for min_pairs"
    slower, took = pairs_until_stop(noise=0.05, pair_s=10.0)
    assert took == 30.0 and len(slower.a_ms) == 3, "three budgets end it below min_pairs"


def test_a_comparison_never_exceeds_max_pairs() -> None:
    generous = TimingConfig(budget_s=1e9, target_rel_noise=0.0, min_pairs=6)
    rule, _ = pairs_until_stop(noise=0.01, pair_s=0.001, cfg=generous)
    assert len(rule.a_ms) == MAX_PAIRS


def test_the_decision_is_the_acceptance_rule_on_the_pairs_taken() -> None:
    rule, _ = pairs_until_stop(noise=0.002, pair_s=0.1, speedup=1.05, seed=3)
    want = accept.decide(rule.a_ms, rule.b_ms, CFG.min_gain)
    assert rule.decision() == want and rule.decision().faster
    rule.add((1.0, 1.0))
    assert rule.decision() == accept.decide(rule.a_ms, rule.b_ms, CFG.min_gain), "follows new pairs"
