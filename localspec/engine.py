"""The engine: a target model, an optional drafter, and the generation loop.

Everything the front ends (CLI, TUI, Python API) need goes through
``Engine.generate``, which returns a ``Generation``: an iterator of events
(``TokenEvent``, ``StepEvent``, ``DoneEvent``) that also exposes the running
statistics, so a caller interrupted midway can still report them.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from localspec.backend import ASSISTANT_TARGETS, AssistantContext, Context, Model, MtpContext, mtp_unavailable_reason
from localspec.chat import Message, render_chat
from localspec.control import DRAFT_LEN_MAX, Controller, Decision
from localspec.costs import CostModel
from localspec.drafting.assistant import AssistantDrafter
from localspec.drafting.base import Drafter
from localspec.drafting.model import ModelDrafter
from localspec.drafting.mtp import MtpDrafter
from localspec.drafting.specs import MTP, DrafterSpec
from localspec.errors import ContextOverflowError, InvalidOptionError, UnsupportedModelError
from localspec.events import ControlSummary, DoneEvent, DrafterStats, Event, GenerationStats, StepEvent, TokenEvent
from localspec.planner import DRAFT_N_UBATCH
from localspec.sampling import Sampler, SamplingParams
from localspec.speculative import speculative_step
from localspec.textstream import TokenReleaser


@dataclass(frozen=True)
class GenerateOptions:
    """How to generate.

    ``draft_len`` is gamma, a fixed number of tokens drafted per step (up to
    ``DRAFT_LEN_MAX``); None (the default) lets the controller choose each step
    from the measured costs and acceptance, including 0 (plain decoding) when
    drafting would not pay. ``p_min``: a draft model stops drafting where its own
    top probability falls below it.
    """

    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    draft_len: int | None = None
    p_min: float = 0.0
    speculative: bool = True
    drafter: str | None = None  # from Engine.drafter_names() (a comma list combines); None: all configured

    def validate(self) -> None:
        self.sampling.validate()
        if self.max_tokens < 1:
            raise InvalidOptionError(f"--max-tokens {self.max_tokens} is out of range: it must be at least 1")
        if self.draft_len is not None and not 0 <= self.draft_len <= DRAFT_LEN_MAX:
            raise InvalidOptionError(
                f"--draft-max {self.draft_len} is out of range: it must be in 0..{DRAFT_LEN_MAX}")
        if not 0.0 <= self.p_min < 1.0:
            raise InvalidOptionError(f"--draft-p-min {self.p_min} is out of range: it must be in [0, 1)")


# Sequences for multi-branch verification: candidate branches and lookahead's window.
TREE_SEQUENCES = 32

DrafterFactory = Callable[[Sampler, GenerateOptions], Drafter]


class Engine:
    """A loaded target with its drafters, ready to generate. Not thread-safe: one generation at a time.

    Drafters: ``draft`` (a model sharing the target's vocabulary, or Gemma 4's assistant
    GGUF, which drafts from the target's own cache), ``mtp`` (the
    target's own NextN layers; the target must be loaded with ``load_mtp``) and
    the model-free ``specs`` (``ngram``, ``lookahead``, ``rest:STORE``).
    """

    def __init__(self, target: Model, *, draft: Model | None = None, specs: Sequence[DrafterSpec] = (),
                 n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512,
                 personal_history: bool = True) -> None:
        if n_ctx < 16:
            raise InvalidOptionError(f"--ctx {n_ctx} is too small: use at least 16 tokens")
        _refuse_assistant_target(target.name, target.architecture)
        model_free = [s for s in specs if s.kind not in ("model", MTP)]
        use_mtp = any(s.kind == MTP for s in specs)
        if use_mtp:
            _check_mtp(target)
        if draft is not None or model_free or use_mtp:
            _check_can_roll_back(target, draft)
            _check_can_branch(target, model_free)
        self.target = target
        self.n_threads = n_threads
        self._controller: Controller | None = None
        self._costs: CostModel | None = None
        # Candidate branches are extra sequences; a recurrent state cannot branch within a batch.
        n_seq = 1 + TREE_SEQUENCES if model_free and target.rollback == "cache" else 1
        self.ctx = Context(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_seq=n_seq)
        self.draft = draft
        # The draft decodes a token at a time: a small batch (localspec.planner.DRAFT_N_UBATCH) shrinks
        # the compute buffer llama.cpp reserves for a batch that wants every row's logits. A draft with a
        # recurrent state drafts on a second sequence and never rolls back (drafting/model.py): no snapshots.
        recurrent_draft = draft is not None and draft.rollback != "cache"
        # Gemma 4's assistant keeps no cache: it runs against the target's (backend.AssistantContext).
        assistant = draft is not None and draft.architecture in ASSISTANT_TARGETS
        self.assistant_ctx: AssistantContext | None = None
        self._assistant_drafter: AssistantDrafter | None = None
        if assistant:
            assert draft is not None
            from localspec.models.gguf_info import read_info

            _check_assistant(read_info(target.path), read_info(draft.path))
            self.assistant_ctx = AssistantContext(draft, self.ctx, n_threads=n_threads)
        self.draft_ctx = (Context(draft, n_ctx=n_ctx, n_batch=min(n_batch, DRAFT_N_UBATCH), n_threads=n_threads,
                                  n_seq=2 if recurrent_draft else 1, n_rs_seq=0 if recurrent_draft else None)
                          if draft is not None and not assistant else None)
        self.personal_history = personal_history
        self._model_free_specs = model_free
        self._factories: dict[str, DrafterFactory] = {}
        if self.draft_ctx is not None:
            draft_ctx = self.draft_ctx
            self._factories["draft"] = lambda sampler, opts: ModelDrafter(draft_ctx, sampler, p_min=opts.p_min)
        if self.assistant_ctx is not None:
            self._factories["draft"] = self._assistant_factory
        # The MTP head: a second context over the target's own weights, fed the target's hidden rows.
        self.mtp_ctx: MtpContext | None = None
        self._mtp_drafter: MtpDrafter | None = None
        if use_mtp:
            self.ctx.enable_hidden_rows()
            self.mtp_ctx = MtpContext(self.ctx, n_batch=min(n_batch, DRAFT_N_UBATCH), n_threads=n_threads)
            self._factories[MTP] = self._mtp_factory
        for spec in model_free:
            self._factories[spec.name] = self._model_free_factory(spec)

    def _mtp_factory(self, sampler: Sampler, opts: GenerateOptions) -> Drafter:
        """One MTP drafter at a time listens to the target's decodes: a new generation replaces it."""
        assert self.mtp_ctx is not None
        if self._mtp_drafter is not None:
            self._mtp_drafter.close()
        self._mtp_drafter = MtpDrafter(self.mtp_ctx, self.ctx, sampler, p_min=opts.p_min)
        return self._mtp_drafter

    def _assistant_factory(self, sampler: Sampler, opts: GenerateOptions) -> Drafter:
        """Like the MTP drafter, one assistant drafter at a time listens to the target's decodes."""
        assert self.assistant_ctx is not None
        if self._assistant_drafter is not None:
            self._assistant_drafter.close()
        self._assistant_drafter = AssistantDrafter(self.assistant_ctx, self.ctx, sampler, p_min=opts.p_min)
        return self._assistant_drafter

    def _model_free_factory(self, spec: DrafterSpec) -> DrafterFactory:
        """Model-free drafters live as long as the engine (their indexes outlast one reply)."""
        drafter: Drafter
        if spec.kind == "ngram":
            from localspec.drafting.personal import personal_ngram_drafter

            # The context's n-grams plus the user's past outputs (LOCALSPEC_NO_HISTORY=1: context only).
            drafter = personal_ngram_drafter(self.target.path, max_branches=4 if self.ctx.n_seq > 1 else 1,
                                             personal=self.personal_history)
        elif spec.kind == "rest":
            from localspec.drafting.rest import RestDrafter

            drafter = RestDrafter.open(spec.arg or "", self.target.path, name=spec.name)
            if self.ctx.n_seq == 1:
                drafter.max_branches = 1  # chains only: the target cannot branch
        elif spec.kind == "lookahead":
            from localspec.drafting.lookahead import LookaheadDrafter

            drafter = LookaheadDrafter(max_seqs=TREE_SEQUENCES)
        else:
            raise InvalidOptionError(f"unknown drafter kind {spec.kind!r}")
        return lambda sampler, opts: drafter

    def reset_learning(self) -> None:
        """Forget what the drafters and controllers learned (n-gram pools, acceptance estimates).

        The measured costs stay: they belong to the machine. ``localspec bench``
        calls this before each run so that no run profits from an earlier one.
        """
        self._controller = None
        for spec in self._model_free_specs:
            self._factories[spec.name] = self._model_free_factory(spec)

    def cost_model(self, *, measure: bool = True) -> CostModel | None:
        """The costs the controllers plan with (measured or loaded on first use; None if not yet and not
        ``measure``)."""
        if self._costs is None and measure:
            from localspec.measure_costs import load_or_measure

            self._costs = load_or_measure(self.ctx, n_threads=self.n_threads)
            if self.draft_ctx is not None:
                self._costs.set_model_drafter("draft", load_or_measure(self.draft_ctx, n_threads=self.n_threads))
            if self.mtp_ctx is not None:
                from localspec.measure_costs import load_or_measure_mtp

                # The head drafts like a draft model, its catch-up one pass per chained head.
                head_costs = load_or_measure_mtp(self.mtp_ctx, self.ctx, n_threads=self.n_threads)
                self._costs.set_model_drafter(MTP, head_costs, passes=self.mtp_ctx.n_heads)
            if self.assistant_ctx is not None:
                # A first guess, refined by every proposal the controller observes: the assistant's
                # layers and the output matrix per drafted token, against the trunk's.
                share = (1 + self.assistant_ctx.n_layers) / (self.target.n_layers + 1)
                one = self._costs.verify_ms(1) * share
                self._costs.set_draft_cost("draft", one, one)
        return self._costs

    @classmethod
    def load(cls, target: str | Path, draft: str | Path | None = None, *, specs: Sequence[DrafterSpec] = (),
             n_ctx: int = 4096, n_threads: int | None = None, n_gpu_layers: int = -1,
             draft_n_gpu_layers: int = -1, personal_history: bool = True) -> "Engine":
        """Check the files from their GGUF metadata first (no weights read), then load.

        ``draft`` is the draft model's GGUF path; ``specs`` the model-free drafters.
        """
        from localspec.models.gguf_info import check_draft_compatible, read_info

        target_info = read_info(target)
        _refuse_assistant_target(target_info.label, target_info.architecture)
        draft_info = read_info(draft) if draft is not None else None
        if draft_info is not None:
            check_draft_compatible(target_info, draft_info)
            if draft_info.architecture in ASSISTANT_TARGETS:
                _check_assistant(target_info, draft_info)
        use_mtp = any(s.kind == MTP for s in specs)
        if use_mtp:
            _check_mtp_file(target_info)
        target_model = Model(target, n_gpu_layers=n_gpu_layers, load_mtp=use_mtp)
        draft_model = None
        try:
            draft_model = Model(draft, n_gpu_layers=draft_n_gpu_layers) if draft is not None else None
            return cls(target_model, draft=draft_model, specs=specs, n_ctx=n_ctx, n_threads=n_threads,
                       personal_history=personal_history)
        except BaseException:
            # A refused load keeps no weights alive (the caller may retry without --draft).
            for model in (target_model, draft_model):
                if model is not None:
                    model.close()
            raise

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    # --- prompts -----------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return self.target.tokenize(text, add_special=True, parse_special=False)

    def chat_tokens(self, messages: Sequence[Message | Mapping[str, str]]) -> list[int]:
        """Messages rendered with the model's own template, then tokenized (special tokens parsed)."""
        bos = self.target.token_text(self.target.bos) if self.target.bos >= 0 else ""
        eos = self.target.token_text(self.target.eos) if self.target.eos >= 0 else ""
        text = render_chat(self.target.chat_template(), messages, bos_token=bos, eos_token=eos,
                           model_name=self.target.name)
        # The template may already begin with BOS; never add a second one.
        add_bos = not (bos and text.startswith(bos))
        return self.target.tokenize(text, add_special=add_bos, parse_special=True)

    # --- generation --------------------------------------------------------
    def drafter_names(self) -> list[str]:
        """The drafters this engine can use; with several, their combination comes first."""
        names = list(self._factories)
        return [",".join(names), *names] if len(names) > 1 else names

    @property
    def draft_len_limit(self) -> int | None:
        """The most tokens any step may draft whatever is asked (None: no limit beyond the options').

        The one place where the backend bounds the draft length: a hybrid target
        that rolls back by recurrent-state snapshots takes back at most
        ``Context.max_rollback`` tokens (a draft model's context never rolls back
        past its last batch: a recurrent draft drafts on a sequence copy).
        """
        return self.ctx.max_rollback

    def controller(self) -> Controller:
        """The controller; it keeps learning across generations.

        The first call measures the target's (and draft model's) verification
        costs (a few seconds each: two depths of the context), cached on disk per model and build.
        """
        if self._controller is None:
            costs = self.cost_model()
            assert costs is not None
            self._controller = Controller(costs, ends_line=self.target.ends_line)
        return self._controller

    def make_drafters(self, sampler: Sampler, opts: GenerateOptions) -> list[Drafter]:
        """The drafters ``opts`` asks for (all configured ones by default; none for plain decoding)."""
        if not opts.speculative or opts.draft_len == 0 or not self._factories:
            return []
        wanted = opts.drafter.split(",") if opts.drafter else list(self._factories)
        unknown = [n for n in wanted if n not in self._factories]
        if unknown:
            raise InvalidOptionError(
                f"unknown drafter {unknown[0]!r}; this engine has: {', '.join(self._factories) or 'none'}"
            )
        return [self._factories[n](sampler, opts) for n in wanted]

    def generate(self, prompt: str | Sequence[int], opts: GenerateOptions | None = None) -> "Generation":
        opts = opts or GenerateOptions()
        opts.validate()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise InvalidOptionError("the prompt is empty; give some text to continue")
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(tokens)} tokens but the context holds {self.n_ctx}; "
                "shorten the prompt or raise --ctx"
            )
        return Generation(self, tokens, opts)

    def invalidate(self) -> None:
        """Forget cache contents after an interruption left them in an unknown state."""
        self.ctx.clear()
        if self.draft_ctx is not None:
            self.draft_ctx.clear()
        if self._mtp_drafter is not None:
            self._mtp_drafter.reset()

    def close(self) -> None:
        if self._mtp_drafter is not None:
            self._mtp_drafter.close()
        if self._assistant_drafter is not None:
            self._assistant_drafter.close()
        # The MTP and assistant contexts before the target's: they were created over it (ctx_other).
        for obj in (self.mtp_ctx, self.assistant_ctx, self.ctx, self.draft_ctx, self.target, self.draft):
            if obj is not None:
                obj.close()


_MTP_FIX = "draft with ngram, lookahead or a draft model instead (--draft ngram)"


def _check_mtp_file(info) -> None:  # noqa: ANN001  (a gguf_info.GGUFInfo)
    """Refuse ``mtp`` from the GGUF header, before any weights are read."""
    reason = mtp_unavailable_reason()
    if reason is not None:
        raise UnsupportedModelError(f"--draft mtp is unavailable: {reason}")
    if info.n_nextn_layers < 1:
        raise UnsupportedModelError(
            f"{info.name} has no MTP (NextN) layers ({info.architecture}.nextn_predict_layers is absent), "
            f"so it cannot draft for itself; {_MTP_FIX}")
    if not info.has_mtp:
        raise UnsupportedModelError(
            f"{info.name} declares {info.n_nextn_layers} MTP layer(s) but this GGUF carries no weights for "
            f"them (the conversion stripped them); use a GGUF that keeps them, or {_MTP_FIX}")


def _refuse_assistant_target(name: str, architecture: str) -> None:
    """An assistant has no cache of its own: it can only draft beside its target."""
    if architecture in ASSISTANT_TARGETS:
        want = ASSISTANT_TARGETS[architecture]
        raise UnsupportedModelError(
            f"{name} is an assistant ({architecture}): it drafts from a {want} target's own cache and cannot "
            f"run alone; give the {want} model as the model and this file as --draft")


def _check_assistant(target_info, assistant_info) -> None:  # noqa: ANN001  (gguf_info.GGUFInfo)
    """Refuse a Gemma 4 assistant draft that this build cannot run or that does not fit the target."""
    from localspec.drafting.assistant import check_assistant_fits

    if reason := mtp_unavailable_reason():
        raise UnsupportedModelError(f"the assistant draft {assistant_info.label} cannot run: {reason}")
    check_assistant_fits(target_info, assistant_info)


def _check_mtp(target: Model) -> None:
    """Refuse ``mtp`` for a loaded target that cannot run its NextN layers."""
    reason = mtp_unavailable_reason()
    if reason is not None:
        raise UnsupportedModelError(f"--draft mtp is unavailable: {reason}")
    if target.n_nextn_layers < 1:
        arch = target.metadata("general.architecture") or "unknown"
        raise UnsupportedModelError(
            f"{target.name} has no MTP (NextN) layers ({arch}.nextn_predict_layers is absent), "
            f"so it cannot draft for itself; {_MTP_FIX}")
    if not target.load_mtp:
        raise UnsupportedModelError(f"{target.name} was loaded without its MTP layers; load it with "
                                    "Model(..., load_mtp=True) to draft with them")


def _check_can_roll_back(target: Model, draft: Model | None) -> None:
    """Refuse speculation, before any context exists, when a cache it must cut back cannot be cut.

    A rejected draft token is removed from the target's cache, and a draft
    model's cache drops whatever the target did not accept. Hybrid models that
    llama.cpp snapshots per token (Qwen3.5, LFM2, Nemotron-H...) take back up
    to ``Context.max_rollback`` tokens, and the draft length is capped to it.
    Other recurrent and hybrid models (Mamba, RWKV, Jamba...) keep one running
    state without snapshots in this llama.cpp, so neither role can be theirs.
    """
    for model, role, fix in ((target, "target", "run it without --draft"),
                             (draft, "draft", "draft with a transformer model of the target's family or "
                                              "with ngram/lookahead")):
        if model is not None and not model.can_rollback:
            kind = "recurrent" if model.is_recurrent else "hybrid"
            raise UnsupportedModelError(
                f"{role} {model.name} is a {kind} model ({model.architecture}): its cache keeps one running "
                f"state, not an entry per token, and this llama.cpp keeps no snapshots of it for that "
                f"architecture, so it cannot roll back rejected draft tokens and speculative decoding is "
                f"impossible; {fix}"
            )


def _check_can_branch(target: Model, specs: Sequence[DrafterSpec]) -> None:
    """Refuse lookahead on a target with a recurrent state: its window needs sequences that branch.

    llama.cpp decodes a recurrent state one sequence after another and refuses a
    batch in which a token belongs to several sequences, so such a target
    verifies chains only (n-gram and REST drafters then propose chains).
    """
    if target.rollback != "cache" and any(s.kind == "lookahead" for s in specs):
        raise UnsupportedModelError(
            f"target {target.name} is a hybrid model ({target.architecture}): lookahead runs its window in "
            "extra sequences that branch from the history, which a recurrent state cannot do; draft with "
            "ngram or a draft model instead"
        )


class _Tally:
    """Running counts behind GenerationStats."""

    def __init__(self, prompt_tokens: int, controller: Controller | None = None, n_ctx: int = 0) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.controller = controller
        self.control_before = controller.stats.copy() if controller is not None else None
        self.tokens = self.steps = self.drafted = self.accepted = self.verified = 0
        self.prefill_ms = self.draft_ms = self.verify_ms = self.python_ms = 0.0
        self.start = self.end = 0.0
        self.pos_drafted: list[int] = []
        self.pos_accepted: list[int] = []
        self.by_drafter: dict[str, list[int]] = {}

    def add(self, step: StepEvent) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.verified += step.verified
        self.draft_ms += step.draft_ms
        self.verify_ms += step.verify_ms
        self.python_ms += step.python_ms
        if step.drafted:
            reached = min(step.drafted, step.accepted + 1)
            while len(self.pos_drafted) < step.drafted:
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            for i in range(reached):
                self.pos_drafted[i] += 1
            for i in range(step.accepted):
                self.pos_accepted[i] += 1
            row = self.by_drafter.setdefault(step.drafter or "draft", [0, 0, 0])
            row[0] += 1
            row[1] += step.drafted
            row[2] += step.accepted

    def snapshot(self) -> GenerationStats:
        end = self.end or time.perf_counter()
        return GenerationStats(
            prompt_tokens=self.prompt_tokens, tokens=self.tokens, steps=self.steps,
            drafted=self.drafted, accepted=self.accepted, verified=self.verified,
            elapsed_s=max(0.0, end - self.start) if self.start else 0.0,
            prefill_ms=self.prefill_ms, draft_ms=self.draft_ms,
            verify_ms=self.verify_ms, python_ms=self.python_ms,
            position_drafted=tuple(self.pos_drafted), position_accepted=tuple(self.pos_accepted),
            drafters=tuple(DrafterStats(name, *row) for name, row in self.by_drafter.items()),
            control=self._control(), n_ctx=self.n_ctx,
        )

    def _control(self) -> ControlSummary | None:
        if self.controller is None or self.control_before is None:
            return None
        c = self.controller.stats.since(self.control_before)
        return ControlSummary(draft_steps=c.draft_steps, plain_steps=c.plain_steps, probes=c.probes,
                              mean_draft_len=c.mean_draft_len, expected_gain=c.expected_gain,
                              measured_gain=c.measured_gain,
                              last_reason=c.last_reason if c.steps else "")


class Generation(Iterator[Event]):
    """One generation in progress: iterate it for events.

    The loop (``_run``) is prefill, then per step: plan (the controller's
    decision), step (``speculative_step``), observe (the controller learns),
    emit (token and step events, stop checks). ``cancel()`` (from another
    thread, e.g. the TUI's Esc) ends it after the current step with
    ``finish_reason == "cancelled"``. If iteration is broken by an exception
    (Ctrl-C), ``interrupted()`` still returns a DoneEvent with everything
    generated and measured so far.
    """

    def __init__(self, engine: Engine, prompt: list[int], opts: GenerateOptions) -> None:
        self.engine = engine
        self.prompt = prompt
        self.opts = opts
        self.sampler = Sampler(opts.sampling)
        self.drafters = engine.make_drafters(self.sampler, opts)
        self.controller = engine.controller() if self.drafters else None
        if self.controller is not None:
            self.controller.start(self.drafters, draft_len=opts.draft_len, draft_len_limit=engine.draft_len_limit)
        self.tally = _Tally(len(prompt), self.controller, engine.n_ctx)
        self.tokens: list[int] = []
        self.text_parts: list[str] = []
        self.result: DoneEvent | None = None
        self.warnings: list[str] = []
        self._releaser = TokenReleaser(opts.stop)
        self._cancel = False
        self._events = self._run()

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Event:
        return next(self._events)

    def cancel(self) -> None:
        self._cancel = True

    def run(self) -> DoneEvent:
        """Consume the remaining events; the final DoneEvent (for callers that need no streaming)."""
        for _ in self:
            pass
        assert self.result is not None, "a generation always ends with a DoneEvent"
        return self.result

    def stats(self) -> GenerationStats:
        return self.tally.snapshot()

    def interrupted(self) -> DoneEvent:
        """The DoneEvent for a generation stopped by an exception (Ctrl-C)."""
        if self.result is None:
            self.tally.end = self.tally.end or time.perf_counter()
            self.result = DoneEvent("interrupted", "".join(self.text_parts), tuple(self.tokens), self.stats())
        return self.result

    # --- the loop's stages ---------------------------------------------------
    def _prefill(self) -> list[int]:
        """Decode the prompt into the target's cache (all but its last token). Drafters are only reset:
        a draft model decodes the prompt when the controller first asks it to draft."""
        t0 = time.perf_counter()
        ctx = self.engine.ctx
        history = list(self.prompt)
        # Keep whatever prefix the cache already holds (the previous chat turn).
        # A recurrent state drops a suffix only within its last batch; else the prompt is decoded afresh.
        keep = ctx.keepable(ctx.common_prefix(history[:-1]))
        ctx.rollback_to(keep)
        ctx.append(history[keep:-1])
        for drafter in self.drafters:
            drafter.reset()
        self.tally.start = time.perf_counter()
        self.tally.prefill_ms = (self.tally.start - t0) * 1e3
        return history

    def _halt_reason(self) -> str:
        """Why no further step can run ("" when one can)."""
        if self._cancel:
            return "cancelled"
        if len(self.engine.ctx.tokens) >= self.engine.ctx.n_ctx:
            return "context"
        return ""

    def _plan(self, history: list[int]) -> Decision | None:
        if self.controller is None:
            return None
        ctx = self.engine.ctx
        return self.controller.plan(history, room=ctx.n_ctx - len(ctx.tokens) - 1,
                                    remaining=self.opts.max_tokens - len(self.tokens))

    def _step(self, history: list[int], decision: Decision | None) -> StepEvent:
        if decision is None:
            step = speculative_step(self.engine.ctx, history, None, self.sampler, 0)
        else:
            step = speculative_step(self.engine.ctx, history, decision.drafter, self.sampler, decision.draft_len,
                                    decision.proposal, decision.proposal_ms)
        if decision is None:
            return dataclasses.replace(step, index=self.tally.steps + 1)
        # The controller's own time for this step is the step's Python work too (its lookups are in draft_ms).
        return dataclasses.replace(step, index=self.tally.steps + 1, decision=decision.reason,
                                   python_ms=step.python_ms + decision.planning_ms)

    def _observe(self, step: StepEvent, history: list[int]) -> None:
        if self.controller is not None:
            self.controller.observe(step, history)
        self.tally.add(step)

    def _emit(self, step: StepEvent) -> Iterator[Event]:
        """The step's tokens as events, then the step itself; returns the finish reason ("" to go on)."""
        model = self.engine.target
        reason = ""
        for i, tok in enumerate(step.tokens):
            if model.is_eog(tok):
                reason = "stop"
                break
            self.tokens.append(tok)
            self.tally.tokens += 1
            source = step.drafter if i < step.accepted else None
            for t, text, src in self._releaser.push(tok, model.piece(tok), source):
                self.text_parts.append(text)
                yield TokenEvent(t, text, src)
            if self._releaser.stopped:
                reason = "stop"
                break
            if len(self.tokens) >= self.opts.max_tokens:
                reason = "length"
                break
        yield step
        return reason

    def _finish(self, reason: str) -> Iterator[Event]:
        for t, text, src in self._releaser.finish():
            self.text_parts.append(text)
            yield TokenEvent(t, text, src)
        self.tally.end = time.perf_counter()
        self._remember(reason)
        self.result = DoneEvent(reason, "".join(self.text_parts), tuple(self.tokens), self.stats())
        yield self.result

    def _remember(self, reason: str) -> None:
        """Add a finished reply to the personal store (when an n-gram drafter keeps one)."""
        if not self.drafters or not self.tokens or reason not in ("stop", "length"):
            return
        from localspec.drafting.personal import remember
        from localspec.errors import StoreError

        try:
            for drafter in self.drafters:
                remember(drafter, self.tokens, context=self.prompt)
        except StoreError as err:
            # The reply itself is complete and delivered; only the drafting history missed it.
            self.warnings.append(str(err))

    def _run(self) -> Iterator[Event]:
        try:
            history = self._prefill()
            reason = ""
            while not reason:
                reason = self._halt_reason()
                if reason:
                    break
                decision = self._plan(history)
                step = self._step(history, decision)
                self._observe(step, history)
                reason = yield from self._emit(step)
            yield from self._finish(reason)
        except GeneratorExit:
            # The consumer stopped listening between steps: the caches are consistent.
            raise
        except BaseException:
            # The caches may be mid-step; the next generation starts from scratch.
            self.engine.invalidate()
            raise
