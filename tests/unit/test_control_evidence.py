"""The controller judges a lookup by its evidence: match length, agreement, loops, line starts (simulated)."""

from __future__ import annotations

from controller_sim import (
    CPU,
    GPU,
    LONG_COPY,
    ONE_TOKEN,
    EvidenceLookup,
    Named,
    plan,
    step_event,
)

from localspec.drafting.base import Evidence
from localspec.policy.controller import Controller
from localspec.policy.costs import CostModel
from localspec.policy.estimates import (
    AGREEMENT_CLASSES,
    MATCH_CLASSES,
    evidence_class,
    evidence_prior,
)


# --- a lookup's evidence -------------------------------------------------------------
def test_evidence_classes_and_priors() -> None:
    GAPPED, LOOP = AGREEMENT_CLASSES.index("gapped"), AGREEMENT_CLASSES.index("loop")
    assert evidence_class(LONG_COPY) == (MATCH_CLASSES.index(16), 0)
    assert evidence_class(ONE_TOKEN) == (0, 3)
    assert evidence_class(Evidence(4, 3, (1.0, 0.5))) == (3, 1)
    assert evidence_class(Evidence(9, 3, (0.6,))) == (MATCH_CLASSES.index(8), 2)
    # a match but for one token, however its occurrences agree: a class apart for each match length
    assert evidence_class(Evidence(9, 3, (0.6,), gapped=True)) == (MATCH_CLASSES.index(8), GAPPED)
    assert evidence_class(Evidence(20, 1, (1.0,), gapped=True)) == (MATCH_CLASSES.index(16), GAPPED)
    # a loop carried on: a class apart, by how long the loop has run
    assert evidence_class(Evidence(6, 1, (1.0,), loop=9)) == (MATCH_CLASSES.index(8), LOOP)
    assert evidence_class(Evidence(32, 4, (1.0,), loop=32)) == (MATCH_CLASSES.index(32), LOOP)
    priors = [evidence_prior(c) for c in range(len(MATCH_CLASSES))]
    assert priors == sorted(priors) and priors[0] == 0.5 and priors[-1] > 0.95


def test_a_long_copy_drafts_long_and_a_weak_guess_not_at_all() -> None:
    """The same 15 tokens offered on a CPU: resting on a 20-token match, nearly all of them are
    verified; resting on one shared token whose continuations split, none (verifying even one
    more token costs twice a plain step there)."""
    tokens = tuple(range(1, 16))
    long_copy = plan(Controller(CostModel(CPU), [EvidenceLookup(tokens, LONG_COPY)]))
    weak = plan(Controller(CostModel(CPU), [EvidenceLookup(tokens, ONE_TOKEN)]))
    assert long_copy.name == "ngram" and long_copy.draft_len >= 8
    assert weak.plain and weak.reason.startswith("speculation off")


def test_each_class_of_evidence_learns_its_acceptance_from_the_text() -> None:
    """4-gram matches seen once that the text never follows, 20-token matches it always follows:
    scored against the text on plain steps, each class learns its own rate, and the 4-gram's
    offers stop being drafted while the long copy drafts its whole depth."""
    four = Evidence(4, 1, (1.0,) * 8)
    long_copy = Evidence(20, 1, (1.0,) * 8)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    before = ctl.expected_tokens("ngram", 8, evidence=four)
    for _ in range(30):
        ctl.observe_unused("ngram", [(1, 2, 3, 4, 5, 6, 7, 8)], [9] * 8, deferred=True, evidence=four)
        ctl.observe_unused("ngram", [(1, 2, 3, 4, 5, 6, 7, 8)], [1, 2, 3, 4, 5, 6, 7, 8], deferred=True,
                           evidence=long_copy)
    assert ctl.expected_tokens("ngram", 8, evidence=four) < 1.25 < 3.0 < before
    assert ctl.expected_tokens("ngram", 8, evidence=long_copy) > 8.0
    tokens = tuple(range(1, 9))
    four_offer = Controller(ctl.costs, [EvidenceLookup(tokens, four)])
    four_offer._states = ctl._states
    assert plan(four_offer).plain
    long_offer = Controller(ctl.costs, [EvidenceLookup(tokens, long_copy)])
    long_offer._states = ctl._states
    assert plan(long_offer).draft_len == 8


def test_a_loop_is_learned_apart_from_matches_of_its_length() -> None:
    """A greedy reply breaks its short repeats (an import line twice, then another) and then loops
    for good. Offers resting on 10-token matches that the text left are learned as failures; an offer
    of the same match length that carries on a loop is judged by how loops fare, and is drafted."""
    tokens = tuple(range(1, 9))
    left = Evidence(10, 1, (1.0,) * 8)
    loop = Evidence(10, 1, (1.0,) * 8, loop=12)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    for _ in range(30):
        ctl.observe_unused("ngram", [tokens], [9] * 8, deferred=True, evidence=left)
    assert ctl.expected_tokens("ngram", 8, evidence=left) < 1.25 < 3.0 < ctl.expected_tokens("ngram", 8, evidence=loop)
    for evidence, drafts in ((left, False), (loop, True)):
        offer = Controller(ctl.costs, [EvidenceLookup(tokens, evidence)])
        offer._states = ctl._states
        assert plan(offer).plain is not drafts


def test_verified_steps_teach_the_class_of_their_evidence() -> None:
    """A long match whose drafts are all rejected: within a few dozen steps it is no longer drafted."""
    ctl = Controller(CostModel(CPU), [EvidenceLookup(tuple(range(100, 115)), LONG_COPY)])
    history = [0]
    drafted = []
    for _ in range(40):
        decision = plan(ctl, history=history)
        drafted.append(decision.draft_len)
        history.append(len(history))
        ctl.observe(step_event((history[-1],), "ngram" if decision.draft_len else None, decision.draft_len, 0),
                    history)
    assert drafted[0] >= 8 and drafted[-1] == 0


NL = 99  # a token that ends a line


def copies_that_part_where_lines_start(ctl: Controller, evidence: Evidence, rounds: int = 20) -> None:
    """A rewrite's copies, scored against the text: each follows its source to the end of a line
    (wherever in the draft that falls) and parts at the next line's first token; copies that cross
    no line end are kept whole."""
    for _ in range(rounds):
        for cut in (2, 3, 4, 5):
            draft = tuple(range(1, cut)) + (NL,) + tuple(range(10, 18 - cut))
            text = list(draft[:cut]) + [7] * (8 - cut)
            ctl.observe_unused("ngram", [draft], text, deferred=True, evidence=evidence)
        ctl.observe_unused("ngram", [tuple(range(20, 28))], list(range(20, 28)), deferred=True, evidence=evidence)


def test_a_draft_token_that_starts_a_line_is_judged_by_how_line_starts_fare() -> None:
    """Copies part at line starts, at whatever draft position those fall: the class keeps its
    rates by position (its drafts are right up to the line's end), line-starting tokens learn their
    own, and a proposal is expected to keep less where it crosses a line end, and as much as ever
    where it crosses none."""
    copy = Evidence(6, 1, (1.0,) * 8)
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)], ends_line=lambda t: t == NL)
    copies_that_part_where_lines_start(ctl, copy)
    state = ctl._states["ngram"]
    assert state.line_start_rate < 0.15
    assert min(state.evidence_acceptance(copy).rates(8)) > 0.9  # no dip by position
    crossing = ctl._expected_by_length("ngram", 8, evidence=copy, tokens=(1, 2, NL, 4, 5, 6, 7, 8))
    straight = ctl._expected_by_length("ngram", 8, evidence=copy, tokens=tuple(range(1, 9)))
    assert crossing[8] < 4.5 < 7.0 < straight[8]  # 1 + the three tokens up to the line end, and little more
    # planning: the offer that crosses a line end is drafted up to it, the straight one whole
    for tokens, most in ((1, 2, NL, 4, 5, 6, 7, 8), 3), (tuple(range(1, 9)), 8):
        offer = Controller(ctl.costs, [EvidenceLookup(tokens, copy)], ends_line=lambda t: t == NL)
        offer._states = ctl._states
        assert plan(offer).draft_len == most

    # without line structure the same copies leave a dip by position over every draft of the class
    blind = Controller(CostModel(CPU), [Named("ngram", cheap=True)])
    copies_that_part_where_lines_start(blind, copy)
    assert min(blind._states["ngram"].evidence_acceptance(copy).rates(8)) < 0.7
    assert blind._expected_by_length("ngram", 8, evidence=copy, tokens=tuple(range(1, 9)))[8] < straight[8] - 2.0


def test_a_loops_line_starts_are_judged_by_its_class() -> None:
    """Copies that part where lines start teach line starts a low rate; a loop repeats its lines whole,
    so an offer that carries one on is judged by its class alone, line starts included, and is drafted
    across them; its break at a line start teaches the class, not the line-start rate."""
    ctl = Controller(CostModel(CPU), [Named("ngram", cheap=True)], ends_line=lambda t: t == NL)
    copies_that_part_where_lines_start(ctl, Evidence(6, 1, (1.0,) * 8))
    state = ctl._states["ngram"]
    assert state.line_start_rate < 0.15
    lines = (1, 2, NL) * 3
    loop = Evidence(6, 1, (1.0,) * 8, loop=9)
    for _ in range(10):  # the loop holds
        ctl.observe_unused("ngram", [lines[:8]], list(lines[:8]), deferred=True, evidence=loop)
    crossing = ctl._expected_by_length("ngram", 8, evidence=loop, tokens=lines[:8])
    assert crossing == ctl._expected_by_length("ngram", 8, evidence=loop, tokens=tuple(range(1, 9)))
    assert crossing[8] > 7.0
    offer = Controller(ctl.costs, [EvidenceLookup(lines[:8], loop)], ends_line=lambda t: t == NL)
    offer._states = ctl._states
    assert plan(offer).draft_len == 8
    rate = state.line_start_rate
    ctl.observe_unused("ngram", [lines[:8]], [1, 2, NL, 5, 5, 5, 5, 5], deferred=True, evidence=loop)
    assert state.line_start_rate == rate  # the loop's break taught its class
    assert state.evidence_acceptance(loop).reached[3] > state.evidence_acceptance(loop).kept[3]


def test_a_verified_draft_that_breaks_where_a_line_starts_teaches_the_line_start() -> None:
    copy = Evidence(6, 1, (1.0,) * 8)
    tokens = (1, 2, NL, 4, 5, 6, 7, 8)
    ctl = Controller(CostModel(GPU), [EvidenceLookup(tokens, copy)], ends_line=lambda t: t == NL)
    state = ctl._states["ngram"]
    before = state.line_start_rate
    decision = plan(ctl)
    assert decision.draft_len == 8
    ctl.observe(step_event((1, 2, NL, 7), "ngram", 8, 3), [0, 1, 2, NL, 7])
    assert state.line_start_rate < before
    # the class learned the three positions it got right, not the break
    est = state.evidence_acceptance(copy)
    assert est.reached[:3] == est.kept[:3] and len(est.reached) == 3
