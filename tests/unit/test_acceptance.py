"""localspec.acceptance: greedy verification, and exactness of rejection sampling by statistics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, cast, overload

import numpy as np
import pytest

from localspec.acceptance import Verdict, accept_greedy, accept_sampled
from localspec.sampling import sample

# Upper 0.1% points of the chi-square distribution by degrees of freedom (standard tables):
# each statistical test below fails with probability 0.001 when the code is right. The seeds
# are fixed, so the outcome is deterministic; the significance says how surprising a failure is.
CHI2_CRIT_001 = {
    1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 8: 26.124,
}

N_TRIALS = 100_000


def chi_square(tokens: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic of the drawn tokens against probs, and its degrees of freedom.

    Categories with probability 0 are left out of the statistic but must never be drawn.
    """
    counts = np.bincount(tokens, minlength=probs.size)
    assert counts.size == probs.size
    pos = probs > 0
    drawn_impossible = np.flatnonzero(counts * ~pos)
    assert drawn_impossible.size == 0, f"zero-probability tokens drawn: {drawn_impossible}"
    expected = tokens.size * probs[pos]
    assert expected.min() >= 50, "too few samples for the chi-square approximation"
    return float(((counts[pos] - expected) ** 2 / expected).sum()), int(pos.sum()) - 1


def assert_follows(tokens: np.ndarray, probs: np.ndarray) -> None:
    stat, df = chi_square(tokens, probs)
    crit = CHI2_CRIT_001[df]
    assert stat < crit, f"chi2 = {stat:.1f} >= {crit} (df {df}, n {tokens.size})"


def assert_rate(hits: int, n: int, expected: float) -> None:
    """A binomial proportion within 4.5 standard errors (two-sided p ~ 7e-6) of expected."""
    sd = math.sqrt(expected * (1 - expected) / n)
    assert abs(hits / n - expected) <= 4.5 * sd + 1e-12, (hits / n, expected, sd)


def dist(*weights: float) -> np.ndarray:
    a = np.array(weights, dtype=np.float64)
    return a / a.sum()


# Hand-built distributions over 8 tokens. q puts mass on token 7, where p has none (must never
# be emitted); p puts mass on token 6, where q has none (reachable only through the residual).
P0 = dist(0.20, 0.05, 0.15, 0.25, 0.10, 0.05, 0.20, 0.00)
Q0 = dist(0.05, 0.30, 0.15, 0.10, 0.20, 0.05, 0.00, 0.15)
P1 = dist(0.05, 0.10, 0.30, 0.05, 0.05, 0.25, 0.10, 0.10)
Q1 = dist(0.25, 0.05, 0.10, 0.05, 0.30, 0.05, 0.10, 0.10)
P2 = dist(0.10, 0.10, 0.10, 0.40, 0.05, 0.05, 0.10, 0.10)


@dataclass
class Run:
    drafts: np.ndarray  # (trials, len(draft))
    n_accepted: np.ndarray  # (trials,)
    next_token: np.ndarray  # (trials,)

    def emitted(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The token emitted at ``position`` (0-based) and the mask of trials that emitted one."""
        reached = self.n_accepted >= position
        if position < self.drafts.shape[1]:
            # the drafted token if it was kept, else the correction that replaced it
            tokens = np.where(self.n_accepted > position, self.drafts[:, position], self.next_token)
        else:
            tokens = self.next_token  # the bonus
        return tokens[reached], reached


def run_trials(
    p: list[np.ndarray],
    q: list[np.ndarray] | None,
    seed: int,
    fixed_draft: list[int] | None = None,
    trials: int = N_TRIALS,
) -> Run:
    """Draft (from q, or the fixed tokens) and verify ``trials`` times with seeded generators."""
    n_draft = len(p) - 1
    draft_rng = np.random.default_rng([seed, 0])
    if fixed_draft is not None:
        drafts = np.tile(np.array(fixed_draft, dtype=np.int64), (trials, 1))
    else:
        assert q is not None
        drafts = np.stack(
            [draft_rng.choice(q[i].size, size=trials, p=q[i]) for i in range(n_draft)], axis=1
        ).reshape(trials, n_draft)
    rng = np.random.default_rng([seed, 1])
    n_acc = np.empty(trials, dtype=np.int64)
    nxt = np.empty(trials, dtype=np.int64)
    for t in range(trials):
        v = accept_sampled(drafts[t].tolist(), q, p, rng)
        n_acc[t], nxt[t] = v.n_accepted, v.next_token
    return Run(drafts, n_acc, nxt)


# --- greedy ---------------------------------------------------------------------------------


def test_greedy_all_accepted_emits_the_bonus() -> None:
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == Verdict(n_accepted=3, next_token=8)


def test_greedy_first_rejected() -> None:
    assert accept_greedy([5, 6, 7], [4, 6, 7, 8]) == Verdict(0, 4)


def test_greedy_middle_rejected_ignores_later_matches() -> None:
    assert accept_greedy([5, 6, 7], [5, 9, 7, 8]) == Verdict(1, 9)
    assert accept_greedy([5, 6, 7], [5, 6, 1, 8]) == Verdict(2, 1)


def test_greedy_empty_draft() -> None:
    assert accept_greedy([], [3]) == Verdict(0, 3)


def test_greedy_accepts_numpy_sequences() -> None:
    v = accept_greedy(np.array([1, 2]), np.array([1, 2, 3], dtype=np.int32))
    assert v == Verdict(2, 3) and type(v.next_token) is int


@pytest.mark.parametrize("choices", [[], [1, 2], [1, 2, 3, 4]])
def test_greedy_length_mismatch_is_an_error(choices: list[int]) -> None:
    with pytest.raises(ValueError, match="len"):
        accept_greedy([1, 2], choices)


# --- sampled: exact small cases -------------------------------------------------------------


class FixedRandom:
    """A stand-in Generator whose random() returns a fixed sequence, and counts the calls."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)
        self.calls = 0

    def random(self) -> float:
        self.calls += 1
        return self.values.pop(0)


def fixed(*values: float) -> np.random.Generator:
    return cast(np.random.Generator, FixedRandom(*values))


def test_tokens_with_p_at_least_q_are_accepted_without_a_draw() -> None:
    p = [dist(0.5, 0.5, 0), dist(0.2, 0.8, 0), dist(0, 0, 1)]
    q = [dist(0.5, 0.25, 0.25), dist(0.6, 0.4, 0)]
    rng = FixedRandom(0.3)
    v = accept_sampled([1, 1], q, p, cast(np.random.Generator, rng))
    assert v == Verdict(2, 2)
    assert rng.calls == 1  # only the bonus


def test_acceptance_threshold_is_p_over_q() -> None:
    p = [dist(0.2, 0.8), dist(1, 0)]
    q = [dist(0.8, 0.2)]
    # p(0)/q(0) = 0.25: u = 0.2499 accepts, u = 0.25 rejects (then the residual is token 1)
    assert accept_sampled([0], q, p, fixed(0.2499, 0.5)) == Verdict(1, 0)
    assert accept_sampled([0], q, p, fixed(0.25, 0.0)) == Verdict(0, 1)


def test_residual_is_max_of_p_minus_q() -> None:
    p = [dist(0.1, 0.3, 0.6, 0.0)]
    q = [dist(0.7, 0.3, 0.0, 0.0)]
    p = p + [dist(1, 1, 1, 1)]
    # residual = max(0, p - q) = (0, 0, 0.6, 0): token 2 whatever the draw
    for u in (0.0, 0.5, 1 - 2**-53):
        assert accept_sampled([0], q, p, fixed(0.9, u)) == Verdict(0, 2)


def test_token_the_target_rules_out_is_always_rejected() -> None:
    p = [dist(0, 0, 0, 1), dist(1, 1, 1, 1)]
    rng = np.random.default_rng(0)
    for q in ([dist(0.1, 0.2, 0.3, 0.4)], None):
        for _ in range(50):
            assert accept_sampled([2], q, p, rng) == Verdict(0, 3)


def test_deterministic_draft_rejection_resamples_the_target_without_the_token() -> None:
    p = [dist(0.5, 0.25, 0.25), dist(1, 0, 0)]
    # p(0) = 0.5 < 1 = q(0): reject when u >= 0.5; the residual is p without token 0: (0, .25, .25)
    assert accept_sampled([0], None, p, fixed(0.4999, 0.0)) == Verdict(1, 0)
    assert accept_sampled([0], None, p, fixed(0.5, 0.0)) == Verdict(0, 1)
    assert accept_sampled([0], None, p, fixed(0.5, 0.99)) == Verdict(0, 2)


def test_certain_target_accepts_deterministic_draft_without_a_draw() -> None:
    p = [dist(0, 1, 0), dist(0, 0, 1)]
    rng = FixedRandom(0.7)
    assert accept_sampled([1], None, p, cast(np.random.Generator, rng)) == Verdict(1, 2)
    assert rng.calls == 1


def test_empty_draft_samples_from_p0() -> None:
    p = [dist(0.25, 0.75)]
    assert accept_sampled([], [], p, fixed(0.2)) == Verdict(0, 0)
    assert accept_sampled([], None, p, fixed(0.3)) == Verdict(0, 1)


def test_residual_without_mass_falls_back_to_p() -> None:
    # Only possible through rounding; forced here with a p that sums to less than q.
    p = [np.array([0.4, 0.5]), np.array([1.0, 0.0])]
    q = [np.array([0.5, 0.5])]
    # reject (0.9 >= 0.4 / 0.5), then draw from p: 0.5 * 0.9 = 0.45 -> token 1
    assert accept_sampled([0], q, p, fixed(0.9, 0.5)) == Verdict(0, 1)


def test_inputs_are_not_modified() -> None:
    p = [dist(0.1, 0.3, 0.6), dist(1, 1, 1)]
    q = [dist(0.7, 0.3, 0.0)]
    before = [a.copy() for a in p + q]
    for a in p + q:
        a.flags.writeable = False
    rng = np.random.default_rng(1)
    for _ in range(100):
        accept_sampled([0], q, p, rng)
        accept_sampled([0], None, p, rng)
    for a, b in zip(p + q, before):
        np.testing.assert_array_equal(a, b)


class RecordingSequence(Sequence[np.ndarray]):
    """A lazy p that records which rows the verifier looked at."""

    def __init__(self, rows: list[np.ndarray]) -> None:
        self.rows = rows
        self.seen: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, i: int) -> np.ndarray: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[np.ndarray]: ...
    def __getitem__(self, i: int | slice) -> np.ndarray | Sequence[np.ndarray]:
        assert isinstance(i, int)
        self.seen.append(i)
        return self.rows[i]


def test_target_rows_after_a_rejection_are_never_read() -> None:
    # token 0 at the second position is impossible under p[1]: rejected, p[2] never read
    p = RecordingSequence([dist(0, 1, 0), dist(0, 1, 0), dist(0, 0, 1)])
    assert accept_sampled([1, 0], None, p, np.random.default_rng(0)) == Verdict(1, 1)
    assert p.seen == [0, 1]
    p = RecordingSequence([dist(0, 1, 0), dist(0, 1, 0), dist(0, 0, 1)])
    assert accept_sampled([1, 1], None, p, np.random.default_rng(0)) == Verdict(2, 2)
    assert p.seen == [0, 1, 2]


@pytest.mark.parametrize(
    ("draft", "q", "p", "match"),
    [
        ([0], [dist(1, 1)], [dist(1, 1)], "p needs"),
        ([0], [dist(1, 1)], [dist(1, 1)] * 3, "p needs"),
        ([0], [], [dist(1, 1)] * 2, "q needs"),
        ([0], [dist(1, 1, 1)], [dist(1, 1)] * 2, "entries"),
        ([0], [dist(1, 1)], [dist(1, 1), dist(1, 1, 1)], "entries"),
        ([2], [dist(1, 1)], [dist(1, 1)] * 2, "token id"),
        ([-1], None, [dist(1, 1)] * 2, "token id"),
        ([0], [dist(0, 1)], [dist(1, 1)] * 2, "cannot have been sampled"),
        ([0], None, [np.ones((2, 2))] * 2, "1-D"),
        ([0], None, [np.array([])] * 2, "1-D"),
    ],
)
def test_shape_errors_are_value_errors(
    draft: list[int], q: list[np.ndarray] | None, p: list[np.ndarray], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        accept_sampled(draft, q, p, np.random.default_rng(0))


# --- sampled: statistics --------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_token_run() -> Run:
    """Two tokens sampled from Q0, Q1 and verified against P0, P1, P2."""
    return run_trials([P0, P1, P2], [Q0, Q1], seed=2023)


def test_first_token_follows_p0(two_token_run: Run) -> None:
    first, reached = two_token_run.emitted(0)
    assert reached.all()
    assert_follows(first, P0)


def test_both_acceptance_and_rejection_happen_at_the_predicted_rate(two_token_run: Run) -> None:
    # P(accept the first token) = sum_x q(x) min(1, p(x)/q(x)) = sum_x min(p(x), q(x))
    accepted = int((two_token_run.n_accepted >= 1).sum())
    assert_rate(accepted, N_TRIALS, float(np.minimum(P0, Q0).sum()))
    # and the second, given the first: sum_x min(P1, Q1)
    both = int((two_token_run.n_accepted == 2).sum())
    assert_rate(both, accepted, float(np.minimum(P1, Q1).sum()))


def test_second_token_given_the_first_accepted_follows_p1(two_token_run: Run) -> None:
    second, reached = two_token_run.emitted(1)
    assert reached.sum() > N_TRIALS // 3
    assert_follows(second, P1)


def test_bonus_after_full_acceptance_follows_the_last_p(two_token_run: Run) -> None:
    bonus = two_token_run.next_token[two_token_run.n_accepted == 2]
    assert bonus.size > N_TRIALS // 5
    assert_follows(bonus, P2)


def test_draft_equal_to_target_is_always_accepted_and_bonus_follows_p() -> None:
    run = run_trials([P0, P1], [P0], seed=7)
    assert (run.n_accepted == 1).all()
    assert_follows(run.drafts[:, 0], P0)
    assert_follows(run.next_token, P1)


@pytest.mark.parametrize(
    ("fixed", "p"),
    [
        ([3, 2], [P0, P1, P2]),  # a likely token, then another
        ([7], [P0, P1]),  # a token the target rules out: always rejected
    ],
)
def test_deterministic_draft_emits_target_distribution(
    fixed: list[int], p: list[np.ndarray]
) -> None:
    run = run_trials(p, None, seed=11, fixed_draft=fixed)
    first, _ = run.emitted(0)
    assert_follows(first, P0)
    assert_rate(int((run.n_accepted >= 1).sum()), N_TRIALS, float(P0[fixed[0]]))
    if len(fixed) == 2:
        second, reached = run.emitted(1)
        assert_follows(second, P1)
        assert_rate(int((run.n_accepted == 2).sum()), int(reached.sum()), float(P1[fixed[1]]))
        assert_follows(run.next_token[run.n_accepted == 2], P2)


def test_bonus_alone_follows_p_for_an_empty_draft() -> None:
    rng = np.random.default_rng(3)
    tokens = np.array([accept_sampled([], [], [P2], rng).next_token for _ in range(20_000)])
    assert_follows(tokens, P2)


def test_statistics_would_catch_a_verifier_that_accepts_everything() -> None:
    # The same harness, fed the emissions of a wrong rule (always accept, i.e. emit the draft
    # from Q0), must fail: the tests above are not vacuous.
    rng = np.random.default_rng(0)
    wrong = rng.choice(8, size=N_TRIALS, p=Q0)
    with pytest.raises(AssertionError):
        assert_follows(wrong, P0)
    # and a subtler one: on rejection, resample from p instead of the residual
    accept = rng.random(N_TRIALS) < np.minimum(1, P0[wrong] / Q0[wrong])
    resampled = rng.choice(8, size=N_TRIALS, p=P0)
    with pytest.raises(AssertionError):
        assert_follows(np.where(accept, wrong, resampled), P0)


def test_sample_is_what_the_residual_uses() -> None:
    # accept_sampled draws its correction with sampling.sample: same generator, same token.
    p = [dist(0.1, 0.3, 0.6, 0.0), dist(1, 1, 1, 1)]
    q = [dist(0.7, 0.2, 0.0, 0.1)]
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(200):
        v = accept_sampled([0], q, p, a)
        u = b.random()
        if u < p[0][0] / q[0][0]:
            assert v == Verdict(1, sample(p[1], b))
        else:
            assert v == Verdict(0, sample(np.maximum(p[0] - q[0], 0), b))
