"""Every kind of drafter in one table (``KINDS``): what it is, how its context is built beside the target's,
which class drafts, how long one lives and what the controller first assumes it costs.

The engine reads only this table: ``kind_of`` names each drafter's kind, the target's context gets the
sequences the kinds need (``Kind.trees``, ``Kind.context is None``: a model-free lookup branches), then
``wire`` builds each kind's context and the factory that hands a generation its drafter. Adding a kind
of drafter is a row here and its own module.

Lifetimes: a drafter over a draft model's own cache is made afresh for each generation; a drafter that
listens to the target's decodes (MTP, the assistant, EAGLE-3, DFlash) lives one at a time, a new
generation's closing the last one's (``Listener``); a model-free drafter lives as long as the engine
(its indexes outlast one reply), rebuilt only when the engine forgets what it learned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.backend import ASSISTANT_TARGETS, AssistantContext, Context, DFlashContext, Eagle3Context, Model, MtpContext
from localspec.drafting.assistant import AssistantDrafter
from localspec.drafting.base import Drafter
from localspec.drafting.by_text import TextDrafter
from localspec.drafting.dflash import DFLASH, DFlashDrafter, drafter_name
from localspec.drafting.eagle3 import EAGLE3, Eagle3Drafter
from localspec.drafting.forced import ForcedDrafter
from localspec.drafting.model import ModelDrafter
from localspec.drafting.mtp import MtpDrafter
from localspec.drafting.specs import FORCED, MTP, DrafterSpec
from localspec.errors import InvalidOptionError
from localspec.llama_facts import DRAFT_N_UBATCH
from localspec.sampling import Sampler

if TYPE_CHECKING:
    from localspec.options import GenerateOptions

DrafterFactory = Callable[[Sampler, "GenerateOptions"], Drafter]


@dataclass(frozen=True)
class Setup:
    """What a kind's context and drafter are built from: the loaded models, the target's context, the engine's
    options (``n_batch``: the target's batch; ``tree_sequences``: the sequences a lookahead window may take)."""

    target: Model
    draft: Model | None
    target_ctx: Context
    n_ctx: int
    n_batch: int
    n_threads: int | None
    tree_sequences: int
    personal_history: bool


class Lives(Enum):
    """How long one drafter of a kind lives (see the module notes)."""

    GENERATION = "generation"
    LISTENING = "one at a time"
    ENGINE = "as long as the engine"


class Measured(Enum):
    """A kind whose drafting costs are measured, not guessed: ``MODEL`` like the target (its own context;
    the draft model's, which the engine measures, caches and clears as it does the target's), ``HEAD``
    against the target's own context, when first needed (the MTP head, one pass per chained head)."""

    MODEL = "as a model"
    HEAD = "as a head over the target"


CostGuess = Callable[[Callable[[int], float], Any, Model], tuple[str, float, float]]
"""A first guess of a kind's drafting cost, refined by every proposal the controller observes:
``(verify_ms, context, target) -> (drafter name, ms a proposal, ms a drafted token)``, from what the
target's verification of n rows costs (``verify_ms(n)``)."""


@dataclass(frozen=True)
class Kind:
    """One row of the table."""

    name: str
    chosen: Callable[[DrafterSpec, Model | None, Callable[[], bool]], bool]
    """Whether a ``--draft`` entry is of this kind, given the draft model of a ``model`` entry and whether
    that one drafts by text (``pairing.draft_by_text``, asked of a plain draft model only); the first row
    that says so wins."""
    context: Callable[[Setup], Any] | None
    """Builds the kind's context beside the target's (None: a model-free lookup, which needs none but
    the target's sequences to branch)."""
    drafter: Callable[[Setup, Any, DrafterSpec, Sampler | None, "GenerateOptions | None"], Drafter]
    """A drafter over that context, for a generation's sampler and options (``Lives.ENGINE``: None, None)."""
    lives: Lives
    trees: Callable[[Model | None], bool] = lambda draft: False
    """Grows trees when the controller asks, given the draft model (one target sequence per node)."""
    costs: Measured | CostGuess | None = None
    """How the controller learns its drafting cost (None: a lookup, costing microseconds)."""
    by_text: bool = False
    """Drafts by text, in another tokenizer's tokens (the engine says so to the user)."""


def _is_model(spec: DrafterSpec, draft: Model | None, *architectures: str) -> bool:
    return spec.kind == "model" and draft is not None and (not architectures or draft.architecture in architectures)


def _recurrent(draft: Model | None) -> bool:
    """A draft with a recurrent state: it drafts on a second sequence and never rolls back (``drafting.model``)."""
    return draft is not None and draft.rollback != "cache"


def _draft_context(s: Setup, trees: bool) -> Context:
    """A draft model's own context: a small batch (it decodes a token at a time; ``DRAFT_N_UBATCH`` shrinks the
    compute buffer), a sequence per tree node where it grows trees, two and no snapshots for a recurrent one."""
    assert s.draft is not None
    recurrent = _recurrent(s.draft)
    seqs = 2 if recurrent else s.target_ctx.n_seq if trees and s.target_ctx.n_seq > 1 else 1
    return Context(s.draft, n_ctx=s.n_ctx, n_batch=min(s.n_batch, DRAFT_N_UBATCH), n_threads=s.n_threads,
                   n_seq=seqs, n_rs_seq=0 if recurrent else None)


def _assistant_context(s: Setup) -> AssistantContext:
    """Gemma 4's assistant keeps no cache: it runs against the target's, checked against its headers first."""
    from localspec.drafting.assistant import check_assistant_fits
    from localspec.models.gguf_info import read_info

    assert s.draft is not None
    check_assistant_fits(read_info(s.target.path), read_info(s.draft.path))
    return AssistantContext(s.draft, s.target_ctx, n_threads=s.n_threads)


def _eagle3_context(s: Setup) -> Eagle3Context:
    """An EAGLE-3 draft's context (a sequence per tree node, as the target's), and the target's layer taps."""
    ctx = Eagle3Context(s.draft, s.target_ctx, n_batch=min(s.n_batch, DRAFT_N_UBATCH), n_threads=s.n_threads,
                        n_seq=s.target_ctx.n_seq)
    s.target_ctx.enable_layer_taps(ctx.layers)
    return ctx


def _dflash_context(s: Setup) -> DFlashContext:
    """A DFlash draft's context (one sequence: a tree comes from its one block), and the target's layer taps."""
    ctx = DFlashContext(s.draft, s.target_ctx, n_batch=min(s.n_batch, DRAFT_N_UBATCH), n_threads=s.n_threads)
    s.target_ctx.enable_layer_taps(ctx.layers)
    return ctx


def _mtp_context(s: Setup) -> MtpContext:
    """The MTP head: a second context over the target's own weights, fed the target's hidden rows."""
    s.target_ctx.enable_hidden_rows()
    return MtpContext(s.target_ctx, n_batch=min(s.n_batch, DRAFT_N_UBATCH), n_threads=s.n_threads,
                      n_seq=s.target_ctx.n_seq)


def _assistant_guess(verify_ms: Callable[[int], float], ctx: Any, target: Model) -> tuple[str, float, float]:
    # The assistant's layers and the output matrix per drafted token, against the trunk's.
    one = verify_ms(1) * (1 + ctx.n_layers) / (target.n_layers + 1)
    return "draft", one, one


def _eagle3_guess(verify_ms: Callable[[int], float], ctx: Any, target: Model) -> tuple[str, float, float]:
    # One block and the output matrix per drafted token, against the trunk's layers and the same matrix
    # (the encoder's projection of the caught-up rows is small beside them).
    one = verify_ms(1) * 2 / (target.n_layers + 1)
    return EAGLE3, one, one


def _dflash_guess(verify_ms: Callable[[int], float], ctx: Any, target: Model) -> tuple[str, float, float]:
    # One pass drafts the whole block: a fixed cost (its layers and the output matrix, against the trunk's)
    # and, per drafted token, what one more row adds to a batch, scaled alike.
    share = (ctx.model.n_layers + 1) / (target.n_layers + 1)
    per_row = max(0.0, verify_ms(8) - verify_ms(1)) / 7
    return drafter_name(ctx), verify_ms(1) * share, per_row * share


def model_free_drafter(spec: DrafterSpec, target_path: Path, *, can_branch: bool, tree_sequences: int,
                       personal_history: bool) -> Drafter:
    """A model-free drafter for ``spec`` (``ngram``, ``rest:STORE``, ``lookahead``).

    ``can_branch``: the target verifies trees (extra sequences); without it the
    lookups propose chains only. ``personal_history``: the n-gram drafter also
    looks up the user's past replies for this tokenizer (``LOCALSPEC_NO_HISTORY=1``
    turns that off too).
    """
    if spec.kind == "ngram":
        from localspec.drafting.personal import personal_ngram_drafter

        return personal_ngram_drafter(target_path, max_branches=4 if can_branch else 1, personal=personal_history)
    if spec.kind == "rest":
        from localspec.drafting.rest import RestDrafter

        rest = RestDrafter.open(spec.arg or "", target_path, name=spec.name)
        if not can_branch:
            rest.max_branches = 1
        return rest
    if spec.kind == "lookahead":
        from localspec.drafting.lookahead import LookaheadDrafter

        return LookaheadDrafter(max_seqs=tree_sequences)
    raise InvalidOptionError(f"unknown drafter kind {spec.kind!r}")


def _lookup(s: Setup, ctx: None, spec: DrafterSpec, sampler: None, opts: None) -> Drafter:
    return model_free_drafter(spec, s.target.path, can_branch=s.target_ctx.n_seq > 1,
                              tree_sequences=s.tree_sequences, personal_history=s.personal_history)


KINDS: tuple[Kind, ...] = (
    # Gemma 4's assistant GGUF: drafts from the target's own cache (backend.AssistantContext).
    Kind("assistant", lambda spec, draft, by_text: _is_model(spec, draft, *ASSISTANT_TARGETS), _assistant_context,
         lambda s, ctx, spec, sampler, opts: AssistantDrafter(ctx, s.target_ctx, sampler, p_min=opts.p_min),
         Lives.LISTENING, costs=_assistant_guess),
    # An EAGLE-3 draft: decodes from the target's layer inputs, in its own context (backend.Eagle3Context).
    Kind(EAGLE3, lambda spec, draft, by_text: _is_model(spec, draft, EAGLE3), _eagle3_context,
         lambda s, ctx, spec, sampler, opts: Eagle3Drafter(ctx, s.target_ctx, sampler, p_min=opts.p_min),
         Lives.LISTENING, trees=lambda draft: True, costs=_eagle3_guess),
    # A DFlash or DSpark draft: a block per pass from the target's layer inputs (backend.DFlashContext).
    Kind(DFLASH, lambda spec, draft, by_text: _is_model(spec, draft, DFLASH), _dflash_context,
         lambda s, ctx, spec, sampler, opts: DFlashDrafter(ctx, s.target_ctx, sampler, p_min=opts.p_min),
         Lives.LISTENING, trees=lambda draft: True, costs=_dflash_guess),
    # A draft model of another tokenizer: drafts by text, in its own tokens (drafting/by_text.py); chains only.
    Kind("by-text", lambda spec, draft, by_text: _is_model(spec, draft) and by_text(), lambda s: _draft_context(s, trees=False),
         lambda s, ctx, spec, sampler, opts: TextDrafter(ctx, s.target, p_min=opts.p_min),
         Lives.GENERATION, costs=Measured.MODEL, by_text=True),
    # A draft model sharing the target's vocabulary, with a cache of its own (trees unless recurrent).
    Kind("draft", lambda spec, draft, by_text: _is_model(spec, draft), lambda s: _draft_context(s, trees=True),
         lambda s, ctx, spec, sampler, opts: ModelDrafter(ctx, sampler, p_min=opts.p_min),
         Lives.GENERATION, trees=lambda draft: not _recurrent(draft), costs=Measured.MODEL),
    # The target's own NextN layers, with one layer or chained ones (drafting/mtp.py, mtp_tree.py).
    Kind(MTP, lambda spec, draft, by_text: spec.kind == MTP, _mtp_context,
         lambda s, ctx, spec, sampler, opts: MtpDrafter(ctx, s.target_ctx, sampler, p_min=opts.p_min),
         Lives.LISTENING, trees=lambda draft: True, costs=Measured.HEAD),
    # The model-free lookups: the n-gram index (with the user's past replies), a REST datastore, lookahead.
    Kind("lookup", lambda spec, draft, by_text: spec.kind in ("ngram", "rest", "lookahead"), None, _lookup, Lives.ENGINE),
    # The text the generation's grammar forces (drafting/forced.py): a lookup over that generation's grammar.
    Kind(FORCED, lambda spec, draft, by_text: spec.kind == FORCED, None,
         lambda s, ctx, spec, sampler, opts: ForcedDrafter(s.target, sampler), Lives.GENERATION),
)

def kind_of(spec: DrafterSpec, draft: Model | None, *, by_text: Callable[[], bool] = lambda: False) -> Kind:
    """The kind of the ``--draft`` entry ``spec`` (``draft``: the loaded draft model of a ``model`` entry;
    ``by_text()``: whether a plain draft model drafts by text)."""
    kind = next((k for k in KINDS if k.chosen(spec, draft, by_text)), None)
    if kind is None:
        raise InvalidOptionError(f"unknown drafter kind {spec.kind!r}")
    return kind


class Listener:
    """A factory for a drafter that listens to the target's decodes: one lives at a time, and a new
    generation's closes the last one's (``make(sampler, opts)`` builds it)."""

    def __init__(self, make: DrafterFactory) -> None:
        self._make = make
        self.current: Drafter | None = None

    def __call__(self, sampler: Sampler, opts: "GenerateOptions") -> Drafter:
        self.close()
        self.current = self._make(sampler, opts)
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.close()
            self.current = None


@dataclass
class Wired:
    """A drafter the engine offers: its kind, its ``--draft`` entry, its context (None: model-free) and the
    factory that hands a generation its drafter (``Listener`` for the kinds that listen)."""

    kind: Kind
    spec: DrafterSpec
    context: Any
    make: DrafterFactory

    @property
    def name(self) -> str:
        """Its name among the engine's drafters (``Engine.drafter_names``): ``draft`` for any draft model."""
        return self.spec.name


def factory(kind: Kind, setup: Setup, context: Any, spec: DrafterSpec) -> DrafterFactory:
    """What hands each generation a drafter of ``kind``, as long as that kind's drafters live."""
    if kind.lives is Lives.ENGINE:
        drafter = kind.drafter(setup, context, spec, None, None)
        return lambda sampler, opts: drafter
    make: DrafterFactory = lambda sampler, opts: kind.drafter(setup, context, spec, sampler, opts)  # noqa: E731
    return Listener(make) if kind.lives is Lives.LISTENING else make


def wire(kind: Kind, setup: Setup, spec: DrafterSpec) -> Wired:
    """Build ``kind``'s context beside the target's, and its drafters' factory."""
    context = kind.context(setup) if kind.context is not None else None
    return Wired(kind, spec, context, factory(kind, setup, context, spec))
