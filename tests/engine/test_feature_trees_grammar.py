"""Trees grown by the drafters fed the target's rows (one MTP head, chained MTP heads, a DFlash block)
under a grammar, on real llama.cpp: each node's q is masked by the grammar's state along the node's own
path (``draft_tree.tree_q`` given the history and the path). Sampled, no child the grammar rules out is
proposed; greedy, the row is masked only as far as its argmax needs (``GrammarShaper``'s lazy mask), so a
lesser sibling may be one verification rejects, and the output is plain constrained greedy token for
token. Before the history was passed, growing such a tree raised ``a grammar's history only grows``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, DFlashContext, Grammar, Model, MtpContext
from localspec.constraints import GrammarShaper
from localspec.drafting.base import TreeProposal
from localspec.drafting.dflash import DFlashDrafter
from localspec.drafting.mtp import MtpDrafter
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
LETTERS = "root ::= [a-z ]+"  # words in lower case: a mask that rules out most of the vocabulary
TOKENS = 24


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from eagle3_model import write_dflash_draft, write_llama_target
    from mtp_model import write_mtp_model, write_step35_model

    d = tmp_path_factory.mktemp("trees-grammar")
    return {"mtp": write_mtp_model(d / "glm4moe-mtp.gguf", mix=0.05),
            "chained": write_step35_model(d / "step35-mtp.gguf", mix=0.05),
            "llama": write_llama_target(d / "llama-tiny.gguf", mix=0.3),
            "dflash": write_dflash_draft(d / "dflash-tiny.gguf", agree=True)}


def constrained_greedy(target: Model, grammar: Grammar, prompt: list[int]) -> list[int]:
    """Plain decoding under the grammar: each row masked by the state after the tokens before it."""
    ctx = Context(target, n_ctx=256, n_threads=1)
    shaper = GrammarShaper(grammar, len(prompt), greedy=True)
    try:
        history = list(prompt)
        ctx.append(history)
        for _ in range(TOKENS):
            history.append(int(np.argmax(shaper.shape(ctx.logits(-1), history, ()))))
            ctx.append(history[-1:])
        return history
    finally:
        ctx.close()


def grown_trees(tctx: Context, drafter, sampler: Sampler, prompt: list[int], want: list[int]) -> int:
    """Speculative steps, each verifying a tree the drafter grew under the grammar, until ``want``'s length;
    asserts the output is ``want`` when greedy, and when sampled that every proposed node is a token the
    grammar allows after its path; returns the trees that branched."""
    greedy = sampler.params.greedy
    check = GrammarShaper(sampler.shaper.grammar, len(prompt), greedy=False)  # masks whole rows
    history = list(prompt)
    tctx.append(history[:-1])
    branched = 0
    while len(history) < len(want):
        proposal = drafter.propose_tree(history, 3, 6)
        if isinstance(proposal, TreeProposal):
            tree = proposal.tree
            branched += len(tree.leaves) > 1
            for node in range(0 if greedy else len(tree)):
                path = tuple(tree.tokens[n] for n in tree.path(node))
                allowed = check.shape(np.zeros(tctx.model.n_vocab, dtype=np.float32), history, path[:-1])
                assert np.isfinite(allowed[path[-1]]), f"node {node} proposes a token the grammar rules out"
        speculative_step(tctx, history, drafter, sampler, 3, proposal=proposal)
    if greedy:
        assert history[:len(want)] == want
    return branched


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("kind", ["mtp", "chained", "dflash"])
def test_a_fed_drafters_tree_under_a_grammar_is_masked_along_each_path(files, kind, temperature):
    target_path = files["llama"] if kind == "dflash" else files[kind]
    target = Model(target_path, load_mtp=kind != "dflash")
    draft = Model(files["dflash"]) if kind == "dflash" else None
    grammar = Grammar(target, LETTERS)
    prompt = target.tokenize(PROMPT)
    want = constrained_greedy(target, grammar, prompt)
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 8)
    greedy = temperature == 0.0
    sampler = Sampler(SamplingParams(temperature=temperature, seed=5), GrammarShaper(grammar, len(prompt), greedy=greedy))
    if kind == "dflash":
        head = DFlashContext(draft, tctx, n_threads=1)
        tctx.enable_layer_taps(head.layers)
        drafter = DFlashDrafter(head, tctx, sampler, tree_width=3)
    else:
        tctx.enable_hidden_rows()
        head = MtpContext(tctx, n_threads=1, n_seq=8)
        drafter = MtpDrafter(head, tctx, sampler)
    try:
        assert grown_trees(tctx, drafter, sampler, prompt, want) > 0, "no tree branched: nothing was masked per path"
    finally:
        drafter.close()
        head.close()
        tctx.close()
        target.close()
        if draft is not None:
            draft.close()
