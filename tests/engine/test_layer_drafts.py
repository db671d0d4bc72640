"""EAGLE-3, DFlash and DSpark GGUFs as ``--draft``, the same checks for each, on real llama.cpp.

Both read their target's layer inputs (``tests/support/eagle3_model.py`` writes a tiny dense
``llama`` target and each draft with random weights, built so the draft agrees with its target
often: drafts are both accepted and rejected). What is particular to each (EAGLE-3 reading the
right layers, DFlash's one pass per block, DSpark's Markov head) is in ``test_eagle3.py`` and
``test_dflash.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli import localspec, one_error_line
from stats import assert_first_two_follow, first_two_joint

from localspec.backend import Context, DFlashContext, Eagle3Context, Model
from localspec.drafting.dflash import DFlashDrafter
from localspec.drafting.eagle3 import Eagle3Drafter
from localspec.drafting.specs import parse_draft
from localspec.engine import Engine, GenerateOptions
from localspec.errors import IncompatibleDraftError
from localspec.sampling import Sampler, SamplingParams

PROMPT = "The quick brown fox jumps over the lazy dog, and then"
MIX = 0.3


@dataclass(frozen=True)
class Kind:
    name: str                 # what the stats call it
    writer: str               # its writer in eagle3_model
    context: Any              # its backend context
    drafter: Any              # its drafter
    draft_len: int
    as_model: str             # what the refusal of the draft as the model says
    misfits: tuple[tuple[dict[str, Any], str], ...]  # drafts that do not fit, and the refusal
    options: tuple[tuple[str, Any], ...] = ()  # what its writer is given besides


KINDS = {
    "eagle3": Kind("eagle3", "write_eagle3_draft", Eagle3Context, Eagle3Drafter, 4,
                   "is an EAGLE-3 draft", (
                       ({"target_n_embd": 96}, "reads features 96 wide, the target's are 64"),
                       ({"target_layers": (0, 1, 4)}, r"reads layer\(s\) 4, the target has layers 0..3"),
                       ({"target_layers": (0, 1)}, "names 2 target layers"),
                       ({"n_embd": 32}, "borrows the target's token embedding and output matrix but is 32 wide"),
                   )),
    "dflash": Kind("dflash", "write_dflash_draft", DFlashContext, DFlashDrafter, 3,
                   "is a DFlash draft", (
                       ({"n_embd": 32}, "reads features 32 wide, the target's are 64"),
                       ({"target_layers": (0, 7)}, r"reads layer\(s\) 7, the target has layers 0..3"),
                   )),
    # DSpark: DFlash with a Markov head, trained anchor first, with a confidence head.
    "dspark": Kind("dspark", "write_dflash_draft", DFlashContext, DFlashDrafter, 3,
                   "is a DFlash draft", (
                       ({"block_size": None}, r"DSpark draft without its trained block size \(dflash.block_size\)"),
                       ({"n_embd": 32}, "reads features 32 wide, the target's are 64"),
                   ), (("markov_rank", 8), ("confidence", True))),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> Kind:
    return KINDS[request.param]


@pytest.fixture(scope="module")
def pair(kind: Kind, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    import eagle3_model

    d = tmp_path_factory.mktemp(kind.name)
    return (eagle3_model.write_llama_target(d / "llama-tiny.gguf", mix=MIX),
            getattr(eagle3_model, kind.writer)(d / f"{kind.name}-tiny.gguf", agree=True, **dict(kind.options)))


def _run(engine: Engine, prompt: str, **kw: Any) -> tuple[tuple[int, ...], dict[str, tuple[int, int]]]:
    done = engine.generate(prompt, GenerateOptions(**kw)).run()
    return done.tokens, {d.name: (d.drafted, d.accepted) for d in done.stats.drafters}


@pytest.mark.parametrize("drafters", ["draft", "draft,ngram"])
def test_greedy_with_the_draft_is_plain_greedy(kind: Kind, drafters: str, pair: tuple[Path, Path]) -> None:
    target, draft = pair
    plain = Engine.load(target, n_ctx=512, n_threads=1)
    spec = Engine.load(target, draft, specs=parse_draft(drafters.replace("draft", "").strip(",") or None),
                       n_ctx=512, n_threads=1)
    try:
        assert spec.draft_ctx is None and isinstance(spec.drafter_context("draft"), kind.context)
        greedy = SamplingParams(temperature=0.0)
        seen = [0, 0]
        # The second prompt extends the first (a chat's next turn): both caches keep the shared prefix.
        for prompt in (PROMPT, PROMPT + " after that", "1, 2, 3,"):
            want, _ = _run(plain, prompt, max_tokens=32, sampling=greedy)
            got, by_drafter = _run(spec, prompt, max_tokens=32, sampling=greedy, draft_len=kind.draft_len,
                                   drafter=drafters)
            assert got == want
            assert set(by_drafter) <= {kind.name, "ngram"}  # the stats name the drafter by its kind
            drafted, accepted = by_drafter.get(kind.name, (0, 0))
            seen = [seen[0] + drafted, seen[1] + accepted]
        if drafters == "draft":
            assert 0 < seen[1] < seen[0]  # both accepted and rejected drafts
    finally:
        plain.close()
        spec.close()


def test_sampled_tokens_follow_the_target_distribution(kind: Kind, pair: tuple[Path, Path]) -> None:
    """At T=1 the first two tokens a step emits are distributed as the target's, jointly (chi-square).

    The draft's tokens are accepted by rejection sampling with its own q (DFlash: each block row's q,
    drawn independently); a wrong q, a row read from the wrong position or a verifier that only
    matched would skew the counts."""
    target_path, draft_path = pair
    target, draft = Model(target_path), Model(draft_path)
    tctx = Context(target, n_ctx=256, n_threads=1)
    head = kind.context(draft, tctx, n_threads=1)
    tctx.enable_layer_taps(head.layers)
    sampler = Sampler(SamplingParams(temperature=1.0, top_k=8, seed=7))
    drafter = kind.drafter(head, tctx, sampler)
    prompt = target.tokenize(PROMPT)
    tctx.append(prompt[:-1])  # the drafter keeps these rows' features
    n0 = len(tctx.tokens)
    joint = first_two_joint(tctx, sampler, prompt[-1])
    assert_first_two_follow(tctx, prompt, drafter, sampler, joint, lambda: tctx.rollback_to(n0))
    drafter.close()
    head.close()
    tctx.close()
    target.close()
    draft.close()


def test_the_cli_drafts_with_it(kind: Kind, pair: tuple[Path, Path]) -> None:
    target, draft = pair
    proc = localspec("generate", str(target), "--draft", str(draft), "--prompt", PROMPT, "--max-tokens",
                     "24", "--temp", "0", "--draft-max", "3", "--threads", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert list(stats["drafters"]) == [kind.name]
    assert stats["drafters"][kind.name]["drafted"] > 0


def test_a_draft_that_does_not_fit_is_refused_before_loading(kind: Kind, pair: tuple[Path, Path], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import eagle3_model

    target, _ = pair
    wrongs = [(getattr(eagle3_model, kind.writer)(tmp_path / f"wrong-{i}.gguf", **{**dict(kind.options), **change}),
               message)
              for i, (change, message) in enumerate(kind.misfits)]

    def no_load(self, *args, **kwargs):
        raise AssertionError("weights were loaded before the pair was refused")

    monkeypatch.setattr(Model, "__init__", no_load)
    for wrong, message in wrongs:
        with pytest.raises(IncompatibleDraftError, match=message) as err:
            Engine.load(target, wrong)
        assert "\n" not in str(err.value)


def test_the_cli_refuses_the_draft_as_the_model(kind: Kind, pair: tuple[Path, Path]) -> None:
    _, draft = pair
    line = one_error_line(localspec("generate", str(draft), "--prompt", "Hi", "--threads", "1"))
    assert kind.as_model in line and "--draft" in line
