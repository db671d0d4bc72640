"""Draft trees from a draft model and an EAGLE-3 draft (grown level by level, one sequence per decoded
node) and, through the engine, the controller's choice of chain or tree for them and for a DFlash draft,
on real llama.cpp; and the trees of every drafter fed the target's rows (MTP heads, EAGLE-3, DFlash) under
a grammar.

The tiny models: ``tests/support/eagle3_model.py``'s dense ``llama`` target, a one-layer ``llama`` of the same
seed as its draft model (the same embedding and output matrix: it agrees with the target often, not always),
and the agreeing ``eagle3`` and ``dflash`` drafts. SmolLM2-135M with its Q4_0 copy is the real pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from greedy import assert_matches_plain, plain_greedy
from stats import assert_first_two_follow, first_two_joint

from localspec.backend import Context, DFlashContext, Eagle3Context, Grammar, Model, MtpContext, batch_invariant
from localspec.constraints import GrammarShaper
from localspec.drafting.base import TreeProposal
from localspec.drafting.dflash import DFlashDrafter
from localspec.drafting.eagle3 import Eagle3Drafter
from localspec.drafting.model import ModelDrafter
from localspec.drafting.mtp import MtpDrafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.events import DoneEvent, StepEvent
from localspec.policy.costs import CostModel
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
GREEDY = SamplingParams(temperature=0.0)
# A GPU's costs (verifying 16 costs little more than 1; controller_sim.GPU) and a draft model's there.
GPU = {1: 10.0, 2: 10.1, 4: 10.2, 8: 10.5, 16: 12.0, 32: 14.0}
GPU_DRAFT = {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.05, 16: 1.2, 32: 1.5}
# A 2-core CPU's (SmolLM2-135M, controller_sim.CPU): every verification row costs.
CPU = {1: 5.4, 2: 11.3, 4: 16.2, 8: 24.9, 16: 41.1}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from eagle3_model import write_dflash_draft, write_eagle3_draft, write_llama_target
    from mtp_model import write_mtp_model, write_step35_model

    d = tmp_path_factory.mktemp("model-trees")
    return {"target": write_llama_target(d / "llama-tiny.gguf", mix=0.3),
            "mtp": write_mtp_model(d / "glm4moe-mtp-agree.gguf", mix=0.05),
            "chained": write_step35_model(d / "step35-mtp-agree.gguf", mix=0.05),
            "chained3": write_step35_model(d / "step35-3-mtp-agree.gguf", mix=0.05, n_heads=3),
            "draft": write_llama_target(d / "llama-tiny-draft.gguf", mix=0.3, n_layer=1),
            "eagle3": write_eagle3_draft(d / "eagle3-tiny.gguf", agree=True),
            "dflash": write_dflash_draft(d / "dflash-tiny.gguf", agree=True)}


@pytest.fixture
def pair(tiny):
    target, draft = Model(tiny["target"]), Model(tiny["draft"])
    yield target, draft
    target.close()
    draft.close()


class RecordingContext:
    """The draft's context, with the size of every decode recorded (attribute access passes through)."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.batches: list[int] = []

    def decode(self, tokens, positions, seq_ids=None, outputs=None):  # noqa: ANN001, ANN201
        self.batches.append(len(tokens))
        return self._ctx.decode(tokens, positions, seq_ids, outputs)

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._ctx, name)


def test_greedy_with_draft_model_trees_is_plain_greedy(pair):
    """Trees of 9 nodes, 4 deep: the output is plain greedy's, token for token; the trees branch, a child
    other than the first is kept, each level is one batched draft decode (never one per node), and after
    every proposal the draft's cache holds the history alone (every node's sequence removed)."""
    target, draft = pair
    prompt = target.tokenize(PROMPT)
    want = plain_greedy(target, prompt, 40, n_ctx=256)
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 32)
    dctx = Context(draft, n_ctx=256, n_threads=1, n_seq=1 + 32)
    recording = RecordingContext(dctx)
    sampler = Sampler(GREEDY)
    drafter = ModelDrafter(recording, sampler)  # type: ignore[arg-type]
    assert drafter.tree_width > 1
    try:
        history = list(prompt)
        tctx.append(history[:-1])
        siblings_kept = branched = 0
        while len(history) < len(prompt) + len(want.tokens):
            recording.batches.clear()
            proposal = drafter.propose_tree(history, 4, 9)
            assert isinstance(proposal, TreeProposal) and proposal.child_q is None  # greedy: q's top tokens
            branched += len(proposal.tree.leaves) > 1
            # the catch-up, then at most one decode per level below the root's (depth 4: three)
            assert len(recording.batches) <= 1 + 3 and sum(recording.batches[1:]) < len(proposal.tree)
            assert dctx.tokens == history and all(dctx.seq_pos_max(s) == -1 for s in range(1, dctx.n_seq))
            step = speculative_step(tctx, history, drafter, sampler, 4, proposal=proposal)
            siblings_kept += any(rank > 0 for _, rank in step.walk)
        assert_matches_plain(history[len(prompt):len(prompt) + len(want.tokens)], want, strict=batch_invariant())
        assert branched > 0 and siblings_kept > 0
        assert max(recording.batches) > 1 or siblings_kept  # some level decoded several nodes at once
    finally:
        tctx.close()
        dctx.close()


def test_sampled_tokens_with_draft_model_trees_follow_the_target(pair):
    """At T=1 the first two emitted tokens follow the target's joint distribution (chi-square), the tree's
    children drawn from the draft's q without replacement and judged by recursive rejection sampling."""
    target, draft = pair
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 32)
    dctx = Context(draft, n_ctx=256, n_threads=1, n_seq=1 + 32)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=11))
    drafter = ModelDrafter(dctx, sampler)
    try:
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        n0 = len(tctx.tokens)
        joint = first_two_joint(tctx, sampler, prompt[-1])
        proposal = drafter.propose_tree(prompt, 3, 7)
        assert isinstance(proposal, TreeProposal) and proposal.child_q is not None and () in proposal.child_q
        assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0), trials=1200,
                                tree_nodes=7)
    finally:
        tctx.close()
        dctx.close()


def test_a_recurrent_draft_grows_no_tree(mamba_path):
    """A draft whose state cannot branch (a Mamba drafts on a copy of its one sequence) drafts chains when
    asked for a tree: it declares tree_width 0, so the controller never asks it."""
    draft = Model(mamba_path)
    dctx = Context(draft, n_ctx=256, n_threads=1, n_seq=2, n_rs_seq=0)
    try:
        drafter = ModelDrafter(dctx, Sampler(GREEDY))
        assert drafter.tree_width == 0
        proposal = drafter.propose_tree(draft.tokenize(PROMPT), 3, 7)
        assert not isinstance(proposal, TreeProposal) and len(proposal.tokens) == 3
    finally:
        dctx.close()
        draft.close()


# --- EAGLE-3 ---------------------------------------------------------------------------------------------
@pytest.fixture
def eagle3(tiny):
    """The target's context (33 sequences) with an EAGLE-3 head of as many, reading its layers."""
    target, draft = Model(tiny["target"]), Model(tiny["eagle3"])
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 32)
    head = Eagle3Context(draft, tctx, n_threads=1, n_seq=tctx.n_seq)
    tctx.enable_layer_taps(head.layers)
    yield target, tctx, head
    head.close()
    tctx.close()
    target.close()
    draft.close()


def _greedy_head_trees(target, tctx, head, drafter) -> tuple[int, int, int]:  # noqa: ANN001
    """Decode 40 tokens with ``drafter``'s greedy trees (4 deep, 9 nodes) and check them against plain greedy
    decoding; no node's sequence may outlive its tree. Returns (trees that branched, steps that kept a child
    other than the first, drafted tokens kept)."""
    sampler = Sampler(GREEDY)
    assert drafter.tree_width > 1
    prompt = target.tokenize(PROMPT)
    want = plain_greedy(target, prompt, 40, n_ctx=256)
    history = list(prompt)
    tctx.append(history[:-1])
    branched = siblings_kept = kept = 0
    while len(history) < len(prompt) + len(want.tokens):
        proposal = drafter.propose_tree(history, 4, 9)
        assert isinstance(proposal, TreeProposal)
        branched += len(proposal.tree.leaves) > 1
        assert all(head.seq_pos_max(s) == -1 for s in range(1, head.n_seq))
        step = speculative_step(tctx, history, drafter, sampler, 4, proposal=proposal)
        siblings_kept += any(rank > 0 for _, rank in step.walk)
        kept += step.accepted
    assert_matches_plain(history[len(prompt):len(prompt) + len(want.tokens)], want, strict=batch_invariant())
    return branched, siblings_kept, kept


def test_greedy_with_eagle3_trees_is_plain_greedy(eagle3):
    """Each node decodes on its own sequence fed its parent's pre-norm output: the output is plain greedy's,
    the trees branch and a child other than the first is kept; afterwards no node's sequence is left."""
    target, tctx, head = eagle3
    drafter = Eagle3Drafter(head, tctx, Sampler(GREEDY))
    try:
        branched, siblings_kept, _ = _greedy_head_trees(target, tctx, head, drafter)
        assert branched > 0 and siblings_kept > 0
    finally:
        drafter.close()


def _sampled_head_trees(target, tctx, drafter, sampler, *, first_a_tree: bool) -> None:  # noqa: ANN001
    """The first two tokens through ``drafter``'s sampled 7-node trees follow the target's joint distribution
    (chi-square); ``first_a_tree``: check first that a proposal is a tree carrying each parent's q."""
    try:
        prompt = target.tokenize(PROMPT)
        tctx.append(prompt[:-1])
        n0 = len(tctx.tokens)
        joint = first_two_joint(tctx, sampler, prompt[-1])
        if first_a_tree:
            proposal = drafter.propose_tree(prompt, 3, 7)
            assert isinstance(proposal, TreeProposal) and proposal.child_q is not None
        assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0), trials=1200,
                                tree_nodes=7)
    finally:
        drafter.close()


def test_sampled_tokens_with_eagle3_trees_follow_the_target(eagle3):
    target, tctx, head = eagle3
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=13))
    _sampled_head_trees(target, tctx, Eagle3Drafter(head, tctx, sampler), sampler, first_a_tree=True)


# --- the MTP head --------------------------------------------------------------------------------------
MTP_MODELS = {1: "mtp", 2: "chained", 3: "chained3"}  # NextN heads: the tiny model with them


@pytest.fixture(params=sorted(MTP_MODELS), ids=["1-head", "2-heads", "3-heads"])
def mtp(tiny, request):
    """A glm4moe with one NextN head, or a step35 with two or three chained ones (each agreeing often),
    the head's context with a sequence per node."""
    yield from _head_with_node_sequences(tiny[MTP_MODELS[request.param]], request.param)


@pytest.fixture(params=[2, 3], ids=["2-heads", "3-heads"])
def chained(tiny, request):
    """The step35s with chained heads alone."""
    yield from _head_with_node_sequences(tiny[MTP_MODELS[request.param]], request.param)


def _head_with_node_sequences(path, n_heads: int):  # noqa: ANN001, ANN202
    """(target, its context, the MTP head's context), each with a sequence per tree node; closed after."""
    target = Model(path, load_mtp=True)
    tctx = Context(target, n_ctx=256, n_threads=1, n_seq=1 + 32)
    tctx.enable_hidden_rows()
    head = MtpContext(tctx, n_threads=1, n_seq=tctx.n_seq)
    assert head.n_heads == n_heads
    yield target, tctx, head
    head.close()
    tctx.close()
    target.close()


def test_greedy_with_mtp_trees_is_plain_greedy(mtp):
    """One head grows on from its own output; chained, head d rebuilds each depth-d node's region
    [x_last, t1 .. td] on the node's sequence and the last head grows on past them. The output is plain
    greedy's, the trees branch and drafts are kept; no node's sequence is left and the head's cache
    holds the history alone."""
    target, tctx, head = mtp
    drafter = MtpDrafter(head, tctx, Sampler(GREEDY))
    try:
        branched, _, kept = _greedy_head_trees(target, tctx, head, drafter)
        assert branched > 0 and kept > 0
    finally:
        drafter.close()


def test_sampled_tokens_with_mtp_trees_follow_the_target(mtp):
    target, tctx, head = mtp
    chained = head.n_heads > 1
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=19 if chained else 17))
    _sampled_head_trees(target, tctx, MtpDrafter(head, tctx, sampler), sampler, first_a_tree=chained)


def test_a_chained_trees_first_children_are_the_chains_drafts(chained):
    """At T=0 a tree's first child at each node is q's top token, so the path of first children is the
    chain's draft: the right head at each depth, fed the right path's outputs (head 0's for x_last, then
    head d's over [x_last, t1 .. td], then the last head drafting on). The tree is grown (more nodes than
    its depth) and leaves the cache holding the history."""
    target, tctx, head = chained
    drafter = MtpDrafter(head, tctx, Sampler(GREEDY))
    try:
        history = target.tokenize(PROMPT)
        tctx.append(history)  # the target's hidden rows for every position, the last token's included
        deepest = 0
        for end in range(len(history) - 4, len(history) + 1):
            chain = drafter.propose(history[:end], 4).tokens
            proposal = drafter.propose_tree(history[:end], 4, 9)
            assert isinstance(proposal, TreeProposal)
            tree = proposal.tree
            assert len(tree) == 9 and len(tree.leaves) > 1
            first, node = [], -1  # the path of first children from the root (-1)
            while (children := [i for i, p in enumerate(tree.parents) if p == node]):
                node = children[0]
                first.append(tree.tokens[node])
            assert len(first) >= 2 and tuple(first) == chain[:len(first)]
            deepest = max(deepest, len(first))
            assert head.n_past == end and all(head.seq_pos_max(s) == -1 for s in range(1, head.n_seq))
        assert deepest > head.n_heads  # a first child past the last head's depth
    finally:
        drafter.close()


def test_the_engine_gives_chained_mtp_heads_tree_sequences(tiny):
    engine = Engine.load(tiny["chained"], specs=parse_draft("mtp"), n_ctx=256, n_threads=1)
    try:
        head = engine.drafter_context("mtp")
        assert isinstance(head, MtpContext) and head.n_heads == 2
        assert engine.tree_nodes_limit == 32 and head.n_seq == engine.ctx.n_seq
        drafter = MtpDrafter(head, engine.ctx, Sampler(GREEDY))
        assert drafter.tree_width > 1
        drafter.close()
    finally:
        engine.close()


# --- through the engine: the controller chooses ---------------------------------------------------------
def _generate(engine: Engine, costs: CostModel, prompt: str, max_tokens: int) -> tuple[list[StepEvent], DoneEvent]:
    """A greedy reply whose controller plans with ``costs`` (hand-built: a GPU's or a CPU's)."""
    engine.controller().costs = costs
    steps: list[StepEvent] = []
    done = None
    for event in engine.generate(prompt, GenerateOptions(max_tokens=max_tokens, sampling=GREEDY)):
        if isinstance(event, StepEvent):
            steps.append(event)
        elif isinstance(event, DoneEvent):
            done = event
    assert done is not None
    return steps, done


def _costs(points: dict[int, float], name: str, draft: dict[int, float] | None) -> CostModel:
    costs = CostModel(points)
    if draft is not None:
        costs.set_model_drafter(name, CostModel(draft))
    else:
        costs.set_draft_cost(name, 0.05 * costs.verify_ms(1), 0.01 * costs.verify_ms(1))
    return costs


@pytest.mark.parametrize("kind", ["draft", "eagle3", "dflash", "mtp", "chained"])
def test_the_engine_drafts_trees_at_gpu_costs_and_stays_exact(tiny, kind):
    """``--draft FILE`` (or ``mtp``, with one head or chained ones) alone: at a GPU's costs the controller
    asks the drafter for trees (no option needed), the reply is plain greedy's, and the stats name the
    drafter and count acceptance by tree depth (a tree 4 deep fills 4 positions, however many nodes it has)."""
    if kind in ("mtp", "chained"):
        engine = Engine.load(tiny[kind], specs=parse_draft("mtp"), n_ctx=512, n_threads=1)
        target = draft = engine.target
        kind = "mtp"
    else:
        target, draft = Model(tiny["target"]), Model(tiny[kind])
        engine = Engine(target, draft=draft, n_ctx=512, n_threads=1)
    model_curve = GPU_DRAFT if kind in ("draft", "mtp") else None
    try:
        prompt = engine.tokenize(PROMPT)
        want = plain_greedy(target, prompt, 40, n_ctx=512)
        costs = _costs(GPU, kind, model_curve)
        head = engine.drafter_context("mtp")
        if head is not None:
            costs.set_model_drafter("mtp", CostModel(model_curve), passes=head.n_heads)
        steps, done = _generate(engine, costs, PROMPT, 40)
        trees = [s for s in steps if s.verified > s.drafted]
        assert trees, [s.decision for s in steps]
        assert all("-node tree" in s.decision for s in trees)
        assert all(s.drafter == kind for s in trees) and {d.name for d in done.stats.drafters} == {kind}
        assert_matches_plain(done.tokens, want, strict=batch_invariant())
        stats = done.stats
        assert len(stats.position_drafted) == max(s.drafted for s in steps)  # positions are depths
        assert sum(stats.position_accepted) == stats.accepted == sum(s.accepted for s in steps)
        assert stats.verified > stats.drafted  # the nodes verified exceed the depths drafted
        assert stats.to_dict()["drafters"][kind]["drafted"] == stats.drafted
    finally:
        engine.close()
        target.close()
        draft.close()


def test_the_engine_drafts_no_trees_at_cpu_costs(tiny):
    target, draft = Model(tiny["target"]), Model(tiny["draft"])
    engine = Engine(target, draft=draft, n_ctx=512, n_threads=1)
    try:
        steps, _ = _generate(engine, _costs(CPU, "draft", {k: v / 10 for k, v in CPU.items()}), PROMPT, 30)
        assert not any(s.verified > s.drafted for s in steps)
        assert engine.tree_nodes_limit == 32  # trees were possible: the costs said no
    finally:
        engine.close()
        target.close()
        draft.close()


# --- a real pair ------------------------------------------------------------------------------------------
def test_smollm2_with_its_q4_0_copy_as_a_tree_drafter_is_plain_greedy(smollm2_path, smollm2_q4_0_path):
    target, draft = Model(smollm2_path), Model(smollm2_q4_0_path)
    tctx = Context(target, n_ctx=512, n_seq=1 + 32)
    dctx = Context(draft, n_ctx=512, n_seq=1 + 32)
    sampler = Sampler(GREEDY)
    drafter = ModelDrafter(dctx, sampler)
    try:
        prompt = target.tokenize("Write a short poem about the sea.\n", add_special=True)
        want = plain_greedy(target, prompt, 32, n_ctx=512)
        history = list(prompt)
        tctx.append(history[:-1])
        kept = 0
        while len(history) < len(prompt) + len(want.tokens):
            step = speculative_step(tctx, history, drafter, sampler, 3, tree_nodes=8)
            kept += step.accepted
        assert_matches_plain(history[len(prompt):len(prompt) + len(want.tokens)], want, strict=batch_invariant())
        assert kept > 0
    finally:
        tctx.close()
        dctx.close()
        target.close()
        draft.close()


# Under a grammar (the trees of the drafters fed the target's rows): words in lower case, a mask that
# rules out most of the vocabulary.
LETTERS = "root ::= [a-z ]+"
GRAMMAR_TOKENS = 24


def constrained_greedy(target: Model, grammar: Grammar, prompt: list[int]) -> list[int]:
    """Plain decoding under the grammar: each row masked by the state after the tokens before it."""
    ctx = Context(target, n_ctx=256, n_threads=1)
    shaper = GrammarShaper(grammar, len(prompt), greedy=True)
    try:
        history = list(prompt)
        ctx.append(history)
        for _ in range(GRAMMAR_TOKENS):
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
@pytest.mark.parametrize("kind", ["mtp", "chained", "eagle3", "dflash"])
def test_a_fed_drafters_tree_under_a_grammar_is_masked_along_each_path(tiny, kind, temperature):
    """Trees grown by the drafters fed the target's rows, under a grammar: each node's q is masked by the
    grammar's state along the node's own path (``draft_tree.tree_q`` given the history and the path).
    Sampled, no child the grammar rules out is proposed; greedy, a row is masked only as far as its argmax
    needs (``GrammarShaper``'s lazy mask), so a lesser sibling may be one verification rejects, and the
    output is plain constrained greedy token for token. Before the history was passed, growing such a
    tree raised ``a grammar's history only grows``."""
    fed = kind in ("mtp", "chained")
    target = Model(tiny[kind] if fed else tiny["target"], load_mtp=fed)
    draft = None if fed else Model(tiny[kind])
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
    elif kind == "eagle3":
        head = Eagle3Context(draft, tctx, n_threads=1, n_seq=tctx.n_seq)
        tctx.enable_layer_taps(head.layers)
        drafter = Eagle3Drafter(head, tctx, sampler)
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
