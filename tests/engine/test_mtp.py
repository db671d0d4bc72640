"""``--draft mtp``: a model's own multi-token-prediction layers as the drafter, on real llama.cpp.

The models are tiny GLM-4.5-style GGUFs with one NextN layer and random weights
(``tests/support/mtp_model.py``): one whose head agrees with its trunk often (so drafts
are accepted and rejected), one with plain random weights (drafts are almost
never accepted). SmolLM2 stands for a model without MTP layers.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec import backend
from localspec.backend import Context, Model, MtpContext
from localspec.drafting.mtp import MtpDrafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.errors import UnsupportedModelError
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step
from cli import localspec, one_error_line
from stand_ins import HiddenRowSource
from stats import assert_first_two_follow

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
LONG_PROMPT = " ".join(["Once upon a time there was a small village by the sea."] * 25)  # > the head's batch


@pytest.fixture(scope="module")
def agreeing_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Head and trunk agree often: drafts are accepted and rejected."""
    from mtp_model import write_mtp_model

    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "glm4moe-mtp-agree.gguf", mix=0.05)


@pytest.fixture(scope="module")
def chained_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Step 3.5 style: two chained NextN heads that agree with the trunk often."""
    from mtp_model import write_step35_model

    return write_step35_model(tmp_path_factory.mktemp("mtp") / "step35-mtp-agree.gguf", mix=0.05)


@pytest.fixture(scope="module")
def hybrid_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen3.5 style: Gated DeltaNet layers (rolled back by snapshots) and one MTP layer."""
    from hybrid_model import write_qwen35

    return write_qwen35(tmp_path_factory.mktemp("mtp") / "qwen35-mtp-agree.gguf", mix=0.05)


@pytest.fixture(scope="module")
def random_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mtp_model import write_mtp_model

    return write_mtp_model(tmp_path_factory.mktemp("mtp") / "glm4moe-mtp-random.gguf", seed=3)


def _run(engine: Engine, prompt: str, **kw) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


@pytest.mark.parametrize("model", ["agreeing", "random", "chained", "hybrid"])
@pytest.mark.parametrize("drafters", ["mtp", "mtp,ngram"])
def test_greedy_with_mtp_is_plain_greedy(model, drafters, agreeing_path, random_path, chained_path, hybrid_path):
    path = {"agreeing": agreeing_path, "random": random_path, "chained": chained_path, "hybrid": hybrid_path}[model]
    plain = Engine.load(path, n_ctx=1024, n_threads=1)
    spec = Engine.load(path, specs=parse_draft(drafters), n_ctx=1024, n_threads=1)
    try:
        greedy = SamplingParams(temperature=0.0)
        seen: dict[str, tuple[int, int]] = {}
        # The second prompt extends the first (a chat's next turn): the head keeps the shared prefix.
        # The long one is caught up in several of the head's batches.
        for prompt in (PROMPT, PROMPT + " after that", LONG_PROMPT):
            want, _ = _run(plain, prompt, max_tokens=40, sampling=greedy)
            got, by_drafter = _run(spec, prompt, max_tokens=40, sampling=greedy, draft_len=4, drafter=drafters)
            assert got == want
            for name, (d, a) in by_drafter.items():
                seen[name] = (seen.get(name, (0, 0))[0] + d, seen.get(name, (0, 0))[1] + a)
        assert set(seen) <= set(drafters.split(","))
        if drafters != "mtp":
            # Combined, the controller picks each step's drafter by value and cost; either may win here.
            assert sum(d for d, _ in seen.values()) > 0
            return
        assert seen["mtp"][0] > 0  # the stats name the drafter "mtp"
        if model != "random":
            assert 0 < seen["mtp"][1] < seen["mtp"][0]  # both accepted and rejected drafts were verified
    finally:
        plain.close()
        spec.close()


@contextmanager
def mtp_setup(path: Path, sampler: Sampler, *,
              n_ctx: int = 256) -> Iterator[tuple[Model, Context, MtpContext, MtpDrafter]]:
    """A target with its MTP head and a drafter over them, all closed afterwards. One thread: on a
    machine shared by many jobs, spinning worker threads cost more than they give."""
    target = Model(path, load_mtp=True)
    tctx = Context(target, n_ctx=n_ctx, n_threads=1)
    tctx.enable_hidden_rows()
    head = MtpContext(tctx, n_threads=1)
    drafter = MtpDrafter(head, tctx, sampler)
    try:
        yield target, tctx, head, drafter
    finally:
        drafter.close()
        head.close()
        tctx.close()
        target.close()


@pytest.mark.parametrize("model", ["agreeing", "chained", "hybrid"])
def test_sampled_tokens_follow_the_target_distribution(model, agreeing_path, chained_path, hybrid_path):
    """At T=1 the first two tokens a step emits are distributed as the target's, jointly (chi-square).

    The head's drafts are accepted by rejection sampling with its own distribution q;
    a wrong q (or a verifier that only matched) would skew the counts. With chained
    heads, the second draft token comes from the second head.
    """
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=7))
    path = {"agreeing": agreeing_path, "chained": chained_path, "hybrid": hybrid_path}[model]
    with mtp_setup(path, sampler) as (target, tctx, head, drafter):
        prompt = target.tokenize(PROMPT)

        def restart(tokens: list[int]) -> None:
            # A snapshot-rolled state (the hybrid) takes back only what its last batch allows: start afresh.
            if target.rollback == "snapshots":
                tctx.clear()
            else:
                tctx.rollback_to(0)
            tctx.append(tokens)

        # The target's own joint distribution of the next two tokens: p1(x1) p2(x2 | x1).
        restart(prompt)
        p1 = sampler.distribution(tctx.logits(-1)).copy()
        joint: dict[tuple[int, int], float] = {}
        for x1 in np.flatnonzero(p1):
            restart([*prompt, int(x1)])
            p2 = sampler.distribution(tctx.logits(-1))
            for x2 in np.flatnonzero(p2):
                joint[(int(x1), int(x2))] = float(p1[x1] * p2[x2])
        restart(prompt[:-1])

        assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: restart(prompt[:-1]))


def test_each_draft_depth_uses_its_own_head(tmp_path):
    """Chained heads: head i drafts the token at depth i + 1, the last head drafts on beyond it.

    The second head of this model has its own LM head that can only put token A or B
    first; the first head drafts with the shared output matrix (like the trunk). So the
    first draft token is an ordinary one and every later one is A or B.
    """
    from mtp_model import write_step35_model

    a, b = 100, 200
    path = write_step35_model(tmp_path / "step35-marked.gguf", mix=0.05, marked=(a, b))
    with mtp_setup(path, Sampler(SamplingParams(temperature=0.0))) as (target, tctx, head, drafter):
        assert head.n_heads == 2
        agree = 0
        for prompt in (PROMPT, "Once upon a time", "1, 2, 3, 4, 5,"):
            history = target.tokenize(prompt)
            tctx.rollback_to(0)
            tctx.append(history)
            want = int(np.argmax(tctx.logits(-1)))
            draft = drafter.propose(history, 4).tokens
            assert len(draft) == 4
            assert all(t in (a, b) for t in draft[1:]), draft
            # The first head mostly agrees with the trunk here (its drafts are not A or B)...
            assert draft[0] not in (a, b)
            agree += draft[0] == want
            # ...and a one-token draft never runs the second head.
            assert drafter.propose(history, 1).tokens == (draft[0],)
        assert agree >= 2


def test_chained_drafts_are_each_heads_own_prediction(tmp_path):
    """After speculative steps (every head caught up a few tokens at a time), the first two draft tokens
    are what heads 0 and 1 predict when each runs alone in its own context over the whole history with
    the target's hidden rows (plain random weights: head 1's attention over the history matters)."""
    from mtp_model import write_step35_model

    path = write_step35_model(tmp_path / "step35-random.gguf", seed=5)
    target = Model(path, load_mtp=True)
    greedy = Sampler(SamplingParams(temperature=0.0))
    tctx, ref = Context(target, n_ctx=512, n_threads=1), Context(target, n_ctx=512, n_threads=1)
    heads = [MtpContext(tctx, n_threads=1), MtpContext(ref, n_threads=1), MtpContext(ref, n_threads=1)]
    mine, alone0, alone1 = heads
    tctx.enable_hidden_rows()
    ref.enable_hidden_rows()
    drafter = MtpDrafter(mine, tctx, greedy)
    try:
        history = target.tokenize(PROMPT)
        tctx.append(history[:-1])
        for _ in range(10):
            speculative_step(tctx, history, drafter, greedy, draft_len=3)
        got = drafter.propose(history, 2).tokens

        n = len(history)
        ref.append(history)
        h = np.vstack([np.zeros((1, mine.n_embd), np.float32), ref.hidden_rows(n)[:-1]])
        alone0.decode(history, range(n), h, [False] * (n - 1) + [True])
        d1 = int(np.argmax(alone0.logits(n - 1)))
        o0 = np.array(alone0.hidden(n - 1))
        alone1.set_head(1)
        alone1.decode(history[:-1], range(n - 1), h[:-1], [False] * (n - 1))
        alone1.decode([history[-1], d1], [n - 1, n], np.stack([h[-1], o0]), [False, True])
        assert got == (d1, int(np.argmax(alone1.logits(1))))
    finally:
        drafter.close()
        for head in heads:
            head.close()
        tctx.close()
        ref.close()
        target.close()


def test_cli_refuses_mtp_for_a_model_without_mtp_layers(smollm2_path):
    line = one_error_line(localspec("generate", str(smollm2_path), "--draft", "mtp", "--prompt", "Hi",
                                      "--threads", "1"))
    assert "no MTP (NextN) layers" in line and "nextn_predict_layers" in line and "draft with ngram" in line


def test_cli_drafts_with_mtp_by_default(agreeing_path):
    """No --draft: a model with MTP layers drafts for itself, and the stats name the drafter ``mtp``."""
    proc = localspec("generate", str(agreeing_path), "--prompt", PROMPT, "--max-tokens", "24",
                      "--temp", "0", "--draft-max", "3", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert list(stats["drafters"]) == ["mtp"]
    assert stats["drafters"]["mtp"]["drafted"] > 0


def test_a_stripped_head_is_refused_before_loading(tmp_path):
    from mtp_model import write_mtp_model

    path = write_mtp_model(tmp_path / "stripped.gguf", with_head=False)
    with pytest.raises(UnsupportedModelError, match="carries no weights") as err:
        Engine.load(path, specs=parse_draft("mtp"))
    assert "\n" not in str(err.value)
    # Without mtp it is an ordinary model.
    Engine.load(path, n_ctx=256, n_threads=1).close()


def test_missing_nextn_functions_refuse_mtp(agreeing_path, monkeypatch):
    """A libllama without the C++-linkage NextN functions: --draft mtp is refused in one line."""
    monkeypatch.setitem(backend.nextn._NEXTN_SYMBOLS, "get_embeddings_nextn_ith", "_Z99llama_no_such_function")
    backend.nextn.nextn_api.cache_clear()
    try:
        reason = backend.mtp_unavailable_reason()
        assert reason is not None and "llama_get_embeddings_nextn_ith" in reason
        with pytest.raises(UnsupportedModelError, match="llama_get_embeddings_nextn_ith") as err:
            Engine.load(agreeing_path, specs=parse_draft("mtp"))
        assert "\n" not in str(err.value)
    finally:
        monkeypatch.undo()
        backend.nextn.nextn_api.cache_clear()
    assert backend.mtp_unavailable_reason() is None


def test_the_app_switch_offers_mtp(agreeing_path):
    """``run`` loads mtp beside the model-free drafters; the app's ctrl+o cycles engine.drafter_names()."""
    from localspec.commands.refs import DraftRefs, drafts_for_itself, with_mtp
    from localspec.commands.run import switchable_drafters

    assert drafts_for_itself(agreeing_path)
    specs, opts = switchable_drafters(with_mtp(DraftRefs(None, parse_draft("ngram"))), GenerateOptions())
    assert opts.drafter == "mtp,ngram"
    engine = Engine.load(agreeing_path, specs=specs, n_ctx=256, n_threads=1)
    try:
        assert "mtp" in engine.drafter_names()
    finally:
        engine.close()


class _Head:
    n_embd, n_batch, n_heads, n_seq = 4, 8, 1, 1


class _RecordingHead(_Head):
    """A head that keeps nothing and records where each catch-up started."""

    def __init__(self) -> None:
        self.starts: list[int] = []

    def rollback_to(self, start: int) -> None:
        self.starts.append(start)

    def decode(self, tokens, positions, rows, outputs) -> None:  # noqa: ANN001
        pass


generations = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60), st.lists(st.integers(0, 3), min_size=2,
                                                                                  max_size=30),
                                 st.integers(1, 4)), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(gens=generations)
def test_the_catch_up_starts_where_the_history_parts_from_what_the_cache_was_built_from(gens: list) -> None:
    """Each generation a new history (``reset``): the last one cut at ``keep``, one token changed at
    ``edit`` (anywhere: before the checked tail too) and extended, then drafted from over a few growing
    steps. Every catch-up must rebuild from the first row whose tokens differ from what the cache was
    built from (a drafter that trusted its tail check across a reset would miss the edit; one that
    rebuilt more would cost every step)."""
    head = _RecordingHead()
    drafter = MtpDrafter(head, HiddenRowSource(), Sampler(SamplingParams(temperature=0.0)))  # type: ignore[arg-type]
    built: list[int] = []  # what the cache holds, as a drafter comparing everything sees it
    hist: list[int] = []
    for keep, edit, new, steps in gens:
        hist = hist[:keep] + new
        if edit < len(hist):
            hist[edit] += 4  # a token the alphabet above never holds
        drafter.reset()
        for cut in range(max(2, len(hist) - steps + 1), len(hist) + 1):
            history = hist[:cut]
            shared = next((i for i, (a, b) in enumerate(zip(built, history)) if a != b), min(len(built), cut))
            drafter._catch_up(history)
            assert head.starts[-1] == max(0, min(shared, cut - 1) + drafter.lag - drafter.reads_token)
            built = history[:cut - 1 + drafter.reads_token]


def test_hidden_rows_are_found_by_position_and_token():
    """A tree batch: the accepted path's rows are found; a (position, token) two nodes share is not trusted."""
    rows = HiddenRowSource()
    drafter = MtpDrafter(_Head(), rows, Sampler(SamplingParams(temperature=0.0)))  # type: ignore[arg-type]
    # history [10, 11, 12] fed as a chain: positions 0..2
    rows.block = np.arange(3, dtype=np.float32)[:, None].repeat(4, 1)
    drafter.observe([10, 11, 12], [0, 1, 2], None)
    # a tree after it: root 12 again at 2, then branches 20 | 21 at 3, and 30 under both at 4
    rows.block = np.array([[2], [30], [31], [40], [41]], dtype=np.float32).repeat(4, 1)
    drafter.observe([12, 20, 21, 30, 30], [2, 3, 3, 4, 4], [[0, 1, 2], [1], [2], [1], [2]])
    history = [10, 11, 12, 21, 30]
    assert drafter.rows.row(history, 1)[0] == 1  # from the first batch, untouched by the second
    assert drafter.rows.row(history, 3)[0] == 31  # the accepted branch's own row
    assert not drafter.rows.row(history, 4).any()  # token 30 sits at position 4 in both branches: zeros
    assert not drafter.rows.row(history, -1).any()  # before the start
    # a later batch at position 3 overwrites everything from there on
    rows.block = np.array([[99]], dtype=np.float32).repeat(4, 1)
    drafter.observe([21], [3], None)
    assert drafter.rows.row(history, 3)[0] == 99 and 4 not in drafter.rows


def test_draft_mtp_parses_and_names_itself():
    specs = parse_draft("MTP,ngram")
    assert [(s.kind, s.name) for s in specs] == [("mtp", "mtp"), ("ngram", "ngram")]
    from localspec.commands.refs import DraftRefs, with_mtp

    assert [s.name for s in with_mtp(DraftRefs(None, parse_draft("ngram"))).specs] == ["mtp", "ngram"]
    assert [s.name for s in with_mtp(DraftRefs(None, specs)).specs] == ["mtp", "ngram"]  # not twice


# --- what keeping the head costs ------------------------------------------------------
def test_hidden_rows_kept_for_a_catch_up_are_capped():
    """Kept off, the drafter keeps at most max_rows target rows: the newest; older positions read as zeros."""
    rows = HiddenRowSource()
    drafter = MtpDrafter(_Head(), rows, Sampler(SamplingParams(temperature=0.0)),  # type: ignore[arg-type]
                         max_row_bytes=10 * 4 * _Head.n_embd)
    assert drafter.rows.max_rows == 10
    history = list(range(1000, 1060))
    rows.block = np.arange(20, dtype=np.float32)[:, None].repeat(4, 1) + 1  # a 20-token prefill
    drafter.observe(history[:20], range(20), None)
    assert len(drafter.rows) == 10 and drafter.rows.row(history, 9)[0] == 0 and drafter.rows.row(history, 10)[0] == 11
    for pos in range(20, 60):  # 40 plain steps, one row each, the head never asked
        rows.block = np.full((1, 4), pos + 1, dtype=np.float32)
        drafter.observe([history[pos]], [pos], None)
        assert len(drafter.rows) <= 10
    assert list(drafter.rows) == list(range(50, 60))
    assert drafter.rows.row(history, 59)[0] == 60 and not drafter.rows.row(history, 49).any()
    assert drafter.behind(history) == 60  # the catch-up still decodes every position


def test_mtp_catch_up_is_charged_per_head():
    from localspec.policy.costs import CostModel

    costs = CostModel({1: 10.0, 2: 10.2, 8: 11.0})
    head = CostModel({1: 0.5, 2: 0.6, 64: 6.0})
    costs.set_model_drafter("mtp", head, passes=2)
    assert costs.catch_up_ms("mtp", 2) == 0.0
    assert costs.catch_up_ms("mtp", 64) == pytest.approx(2 * (6.0 - 0.6))
    assert costs.draft_ms("mtp", 3) == pytest.approx((2 * 0.6 - 0.5) + 3 * 0.5)


def test_the_controller_charges_the_heads_catch_up(agreeing_path):
    """A head 150 tokens behind: drafting waits for a cheap catch-up, not for a dear one; caught up,
    the dear head drafts too (its draft steps cost the same). The reply's first token waits for
    neither (issue 10: time to first token does not grow because a drafter is loaded)."""
    from localspec.policy.controller import Controller
    from localspec.policy.costs import CostModel
    from localspec.events import StepEvent

    gpu = {1: 10.0, 2: 10.1, 4: 10.3, 8: 10.8, 16: 12.0}
    cheap = CostModel({1: 0.5, 2: 0.5, 4: 0.6, 64: 1.5, 256: 4.0})
    dear = CostModel({1: 0.5, 2: 0.5, 4: 2.0, 64: 600.0, 256: 2400.0})
    with mtp_setup(agreeing_path, Sampler(SamplingParams(temperature=0.0)), n_ctx=512) as (target, tctx, head, drafter):
        tokens = target.tokenize(LONG_PROMPT)
        history = tokens[:150]
        tctx.append(history[:-1])

        def plan(head_costs: CostModel):
            costs = CostModel(gpu)
            costs.set_model_drafter("mtp", head_costs, passes=head.n_heads)
            ctl = Controller(costs, [drafter])
            behind = drafter.behind(tokens[:149])
            first = ctl.plan(tokens[:149], room=16, remaining=200)
            if behind > 2:
                assert first.plain and first.reason == (
                    f"plain: the first token waits for no catch-up (mtp is {behind} tokens behind)")
            step = StepEvent(index=1, drafter=None, drafted=0, accepted=0, emitted=1, draft_ms=0.0, verify_ms=10.0,
                             python_ms=0.2, verified=0, tokens=(tokens[149],), batch_tokens=1)
            ctl.observe(step, tokens[:150])
            return ctl.plan(history, room=16, remaining=199)

        chosen = plan(cheap)
        assert chosen.name == "mtp" and "catching up 150 tokens" in chosen.reason
        declined = plan(dear)
        assert declined.plain and "catching up 150 tokens" in declined.reason
        drafter.propose(history, 1)  # the catch-up, paid
        assert drafter.behind(history) == 1
        assert plan(dear).name == "mtp"


def test_a_capped_drafter_still_decodes_exactly(agreeing_path, monkeypatch):
    """Rows dropped for the cap (zeros in the head's catch-up) cost acceptance, never the output."""
    from localspec.drafting import fed

    plain = Engine.load(agreeing_path, n_ctx=1024, n_threads=1)
    spec = Engine.load(agreeing_path, specs=parse_draft("mtp"), n_ctx=1024, n_threads=1)
    monkeypatch.setattr(fed, "MAX_ROW_BYTES", 8 * 4 * spec.drafter_context("mtp").n_embd)
    try:
        greedy = SamplingParams(temperature=0.0)
        want, _ = _run(plain, LONG_PROMPT, max_tokens=40, sampling=greedy)
        got, by_drafter = _run(spec, LONG_PROMPT, max_tokens=40, sampling=greedy, draft_len=3, drafter="mtp")
        assert got == want and by_drafter["mtp"][0] > 0
        drafter = spec._factories["mtp"].current  # the live MTP drafter (drafting.factory.Listener)
        assert drafter is not None and drafter.rows.max_rows == 8 and len(drafter.rows) <= 8
    finally:
        plain.close()
        spec.close()
