"""How much of its users' traffic a canary step needs before its error rate can pass, and the tests that judge it.

A step compares the canary's user requests with stable's over the same window:
- against stable, Fisher's exact test, one-sided (the canary fails more often than stable), with the observed rise
  also above rollout.max_error_rate_increase, so that a significant but negligible rise passes;
- against rollout.max_error_rate, the exact binomial test (the canary's rate is above the limit);
- the step needs the fewest canary user requests (`min_canary_requests`) at which those tests catch a canary whose
  error rate is stable's plus rollout.min_error_rate_regression with probability rollout.detection_power; below
  it the window is extended, then inconclusive, never passed.
rollout.false_rollback_rate is the chance a healthy canary (the same error rate as stable's, within the limit) is
rolled back over a whole rollout: it is shared out by Bonferroni over the steps with user traffic, the two tests,
and a step's looks (half to the deciding look, half to the earlier ones, which fail only on stronger evidence)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

# A step never asks for more canary requests than this (settings that need more are past any window's traffic here).
MAX_REQUESTS = 100_000


@dataclass(frozen=True)
class EvidenceRules:
    max_error_rate: float
    max_error_rate_increase: float
    min_error_rate_regression: float
    detection_power: float
    false_rollback_rate: float
    # Steps with user traffic in the rollout, and looks at one step's window (the first plus its extensions).
    user_steps: int
    looks: int

    def alpha(self, deciding: bool) -> float:
        """The significance each of the two tests uses at one look: the deciding look (enough requests, or the last
        one) or an earlier one."""
        step = self.false_rollback_rate / self.user_steps / 2.0
        return step / 2.0 if deciding or self.looks == 1 else step / 2.0 / (self.looks - 1)


def above_limit_p_value(canary_errors: int, canary_requests: int, max_error_rate: float) -> float:
    """The exact binomial test, one-sided: the chance of at least `canary_errors` failures in `canary_requests` from a
    canary failing exactly at the limit."""
    from scipy import stats

    return float(stats.binom.sf(canary_errors - 1, canary_requests, max_error_rate))


def canary_worse_p_value(canary_errors: int, canary_requests: int, stable_errors: int, stable_requests: int) -> float:
    """Fisher's exact test, one-sided: the chance, with both tracks failing at one rate, that the canary holds at
    least `canary_errors` of the window's errors given how many requests each track got (the hypergeometric upper
    tail, as scipy.stats.fisher_exact's alternative="greater" computes it)."""
    from scipy import stats

    if canary_requests == 0:
        return 1.0
    return float(stats.hypergeom.sf(canary_errors - 1, canary_requests + stable_requests,
                                    canary_errors + stable_errors, canary_requests))


def _fails(errors: int, canary_requests: int, stable_errors: int, stable_requests: int, rules: EvidenceRules,
           alpha: float) -> bool:
    if above_limit_p_value(errors, canary_requests, rules.max_error_rate) <= alpha:
        return True
    if not stable_requests:
        return False
    return (errors / canary_requests - stable_errors / stable_requests > rules.max_error_rate_increase
            and canary_worse_p_value(errors, canary_requests, stable_errors, stable_requests) <= alpha)


def _critical_canary_errors(canary_requests: int, stable_errors: int, stable_requests: int, rules: EvidenceRules,
                            alpha: float) -> int:
    """The fewest canary errors that fail the step (either test), for these counts: both p-values fall and the rise
    grows with the canary's errors, so the tests' verdict is monotone in them (none never fails)."""
    passes, fails = 0, canary_requests + 1
    while fails - passes > 1:
        middle = (passes + fails) // 2
        if _fails(middle, canary_requests, stable_errors, stable_requests, rules, alpha):
            fails = middle
        else:
            passes = middle
    return fails


def detection_probability(canary_requests: int, weight: int, stable_error_rate: float, rules: EvidenceRules) -> float:
    """The chance the deciding look fails a canary whose error rate is stable's plus min_error_rate_regression, with
    `canary_requests` canary requests and the step's share of stable ones failing at `stable_error_rate` (at 100%,
    stable has none: the limit's test alone, against a canary failing at max_error_rate plus the regression). Stable's
    errors are taken at their expected count; the simulation in tests/rollout/test_evidence.py draws them."""
    stable_requests = round(canary_requests * (100 - weight) / weight)
    stable_errors = round(stable_requests * stable_error_rate)
    bad = (stable_error_rate if stable_requests else rules.max_error_rate) + rules.min_error_rate_regression
    critical = _critical_canary_errors(canary_requests, stable_errors, stable_requests, rules,
                                       rules.alpha(deciding=True))
    return above_limit_p_value(critical, canary_requests, bad)


@lru_cache(maxsize=256)
def _min_requests(weight: int, stable_error_rate: float, rules: EvidenceRules) -> int:
    def enough(n: int) -> bool:
        return detection_probability(n, weight, stable_error_rate, rules) >= rules.detection_power

    high = 1
    while not enough(high):
        high *= 2
        if high > MAX_REQUESTS:
            return MAX_REQUESTS
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle, high)
    return high


def min_canary_requests(weight: int, stable_error_rate: float, rules: EvidenceRules) -> int:
    """The fewest canary user requests at which a step at `weight`% catches a canary failing
    min_error_rate_regression more often than stable with probability detection_power (stable's rate rounded up to
    two significant digits, so that close windows share the figure)."""
    if stable_error_rate <= 0:
        return _min_requests(weight, 0.0, rules)
    unit = 10.0 ** (math.floor(math.log10(stable_error_rate)) - 1)
    # Rounded before the ceiling, so that a rate already on two digits (0.0013 / 0.0001 = 12.999...) stays as it is.
    return _min_requests(weight, round(math.ceil(round(stable_error_rate / unit, 9)) * unit, 12), rules)
