"""Drafter specs and the protocol (pure), and multi-branch verification on the real model."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.drafting.base import BatchExtra, Drafter, DrafterBase, Proposal, TreeProposal
from localspec.drafting.specs import DrafterSpec, parse_draft
from localspec.drafting.tree import tree_from_branches
from localspec.errors import InvalidOptionError


def test_parse_draft_lists_and_names():
    specs = parse_draft("ngram, rest:~/notes.lsstore,qwen3-0.6b")
    assert specs == [DrafterSpec("ngram"), DrafterSpec("rest", "~/notes.lsstore"), DrafterSpec("model", "qwen3-0.6b")]
    assert [s.name for s in specs] == ["ngram", "rest:notes", "draft"]
    assert parse_draft(None) == [] and parse_draft("") == []
    assert parse_draft("LOOKAHEAD") == [DrafterSpec("lookahead")]
    assert parse_draft("ngram,Forced") == [DrafterSpec("ngram"), DrafterSpec("forced")]


@pytest.mark.parametrize("text,needle", [
    ("ngram,,lookahead", "empty entry"), ("rest", "rest:STORE"), ("rest:", "store path"),
    ("a.gguf,b.gguf", "at most one"), ("ngram,ngram", "twice"),
])
def test_parse_draft_errors(text, needle):
    with pytest.raises(InvalidOptionError, match=needle):
        parse_draft(text)


class Fixed(DrafterBase):
    """A drafter that always proposes the same chain (pure-logic stand-in)."""

    def __init__(self, name: str, tokens: tuple[int, ...]):
        self.name, self.tokens, self.calls, self.kept = name, tokens, 0, []

    def propose(self, history, draft_len):
        self.calls += 1
        return Proposal(self.tokens[:draft_len], None, self.name)

    def accepted(self, history, n_accepted):
        self.kept.append(n_accepted)


def test_every_drafter_states_what_it_offers():
    """The protocol's members exist on every drafter, with the base class's defaults where not overridden."""
    from localspec.drafting.lookahead import LookaheadDrafter
    from localspec.drafting.ngram import NgramDrafter

    plain = Fixed("x", (1,))
    assert isinstance(plain, Drafter)
    assert (plain.cheap, plain.batch_extra_tokens, plain.behind([1, 2, 3])) == (False, 0, 0)
    ngram, lookahead = NgramDrafter(), LookaheadDrafter()
    assert isinstance(ngram, Drafter) and isinstance(lookahead, Drafter)
    assert ngram.cheap and ngram.batch_extra_tokens == 0 and ngram.behind([1, 2]) == 0
    assert not lookahead.cheap and lookahead.batch_extra_tokens == lookahead.width * (lookahead.ngram - 1) - 1


def test_tree_proposal_chain_view_follows_the_most_probable_child():
    from localspec.drafting.tree import build_tree

    tree = build_tree([((1, 2), 3.0), ((1, 3), 1.0), ((4,), 1.0)], max_nodes=10, max_depth=4)
    assert TreeProposal(tree).tokens == (1, 2)
    assert TreeProposal(tree_from_branches(())).tokens == ()


def test_multi_branch_verification_leaves_the_cache_as_if_the_branch_was_decoded_alone(smollm2_path):
    """Keep one branch of a tree: the next logits equal those after decoding that branch alone."""
    from localspec.backend import Context, Model
    from localspec.sampling import Sampler, SamplingParams
    from localspec.speculative import _verify_tree

    model = Model(smollm2_path)
    prompt = model.tokenize("The first five prime numbers are 2, 3, 5, 7 and")
    greedy = Context(model, n_ctx=256)
    greedy.append(prompt)
    cont = []
    for _ in range(3):
        cont.append(int(np.argmax(greedy.logits(-1))))
        greedy.append(cont[-1:])
    # The true continuation is one branch among decoys that share its prefix or not.
    branches = [(cont[0], cont[1], cont[2]), (cont[0], 13, 14), (cont[0], cont[1], 15), (16, 17)]
    tree_ctx = Context(model, n_ctx=256, n_seq=8)
    tree_ctx.append(prompt[:-1])
    accepted, nxt = _verify_tree(tree_ctx, list(prompt), TreeProposal(tree_from_branches(branches)),
                                 Sampler(SamplingParams()))
    assert accepted == tuple(cont[:3])
    assert tree_ctx.tokens == [*prompt, *cont[:3]]

    alone = Context(model, n_ctx=256)
    alone.append(prompt[:-1])
    alone.append([prompt[-1], *cont[:3]], outputs="all")  # the same branch, as a chain verifies it
    probe = [nxt, 42]
    tree_ctx.append(probe)
    alone.append(probe)
    got, want = tree_ctx.logits(-1), alone.logits(-1)
    from localspec.backend import batch_invariant

    if batch_invariant():
        # The accepted branch went first in the batch, so its cells sit exactly where
        # the chain put them: bit-for-bit the same cache.
        np.testing.assert_array_equal(got, want)
    else:
        # With llamafile's sgemm the two batch shapes round differently (tests/support/greedy.py).
        # A leaked decoy token shifts logits by several units (measured ~18); rounding
        # stays well below one.
        assert int(np.argmax(got)) == int(np.argmax(want))
        assert float(np.abs(got - want).max()) < 1.0
    # The decoys' sequences are gone: only sequence 0 holds cells.
    for seq in range(1, 8):
        assert tree_ctx.seq_pos_max(seq) == -1


def window(n: int) -> BatchExtra:
    return BatchExtra(tuple(range(n)), tuple(range(1, n + 1)), tuple((0,) for _ in range(n)),
                      (True,) * n, lambda get: None)


def test_a_proposal_is_shrunk_to_the_free_cells_at_the_end_of_the_context():
    from localspec.speculative import fit_proposal

    def _fit_batch(proposal, free_cells):
        return fit_proposal(proposal, 64, free_cells)

    tree = tree_from_branches([(1, 2, 3), (1, 4), (5,)])  # 5 nodes, depth 3
    full = TreeProposal(tree, "lookahead", window(6))
    assert _fit_batch(full, 1 + 5 + 6) is full
    no_window = _fit_batch(full, 1 + 5 + 5)
    assert isinstance(no_window, TreeProposal) and no_window.tree is tree and no_window.extra is None
    chain = _fit_batch(full, 3)  # `last` and two draft tokens fit
    assert isinstance(chain, Proposal) and chain.tokens == full.tokens[:2] and chain.drafter == "lookahead"
    assert _fit_batch(full, 1).tokens == ()
    probs = tuple(np.full(4, 0.25) for _ in range(3))
    cut = _fit_batch(Proposal((1, 2, 3), probs, "draft"), 3)
    assert cut.tokens == (1, 2) and len(cut.probs) == 2


def test_a_proposal_made_while_planning_is_cut_to_the_planned_depth():
    from localspec.speculative import fit_proposal

    tree = tree_from_branches([(1, 2, 3), (1, 4), (5,)])
    cut = fit_proposal(TreeProposal(tree, "ngram", window(3)), 2, 64)
    assert isinstance(cut, TreeProposal) and sorted(cut.tree.branches) == [(1, 2), (1, 4), (5,)]
    assert cut.extra is not None and cut.drafter == "ngram"
    probs = tuple(np.full(4, 0.25) for _ in range(3))
    chain = fit_proposal(Proposal((1, 2, 3), probs, "draft"), 1, 64)
    assert chain.tokens == (1,) and len(chain.probs) == 1
    assert fit_proposal(chain, 1, 64) is chain  # what fits is verified as it is


def test_off_cannot_be_one_entry_of_a_list():
    """Issue 33: --draft off,ngram said "unknown drafter 'off'; did you mean 'off'?"."""
    for text, other in (("off,ngram", "ngram"), ("ngram, OFF", "ngram"), ("none,lookahead,ngram", "lookahead,ngram"),
                        ("off,off", "ngram")):
        with pytest.raises(InvalidOptionError) as err:
            parse_draft(text)
        message = str(err.value)
        assert "means no drafter and cannot be combined with others" in message, message
        assert message.endswith(f"or --draft {other}") and "did you mean" not in message
