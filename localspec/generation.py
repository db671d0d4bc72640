"""A generation in progress: the loop around the speculative step, and its running statistics.

``Generation`` is what ``Engine.generate`` returns: prefill, then per step
plan (the controller's decision), step (``speculative_step``), observe (the
controller learns), emit (token and step events, stop checks). It is an
iterator of events; ``stats()`` reads the running counts at any time.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, ContextManager, Iterator, Protocol

from localspec.errors import EngineStateError
from localspec.events import (
    ControlSummary,
    DoneEvent,
    DrafterStats,
    PrefillEvent,
    Event,
    GenerationStats,
    StepEvent,
    TokenEvent,
    TokenLogprob,
)
from localspec.policy.controller import Controller
from localspec.penalties import penalty_shaper
from localspec.sampling import Sampler, compose
from localspec.speculative import speculative_step
from localspec.textstream import TokenReleaser

if TYPE_CHECKING:
    from localspec.backend import Context, Model
    from localspec.drafting.base import Drafter
    from localspec.options import GenerateOptions
    from localspec.sampling import RowShaper


class EngineSide(Protocol):
    """What a generation uses of the engine that made it (``Engine`` is one): its caches and model, the
    turn it holds them by, and how it gives them back. It knows no more of the engine than this."""

    ctx: "Context"
    target: "Model"

    @property
    def n_ctx(self) -> int: ...

    @property
    def draft_len_limit(self) -> int | None: ...

    @property
    def tree_nodes_limit(self) -> int: ...

    def shaper(self, opts: "GenerateOptions", start: int) -> "RowShaper | None": ...

    def make_drafters(self, sampler: Sampler, opts: "GenerateOptions") -> "list[Drafter]": ...

    def controller(self) -> Controller: ...

    def costs_pending(self) -> bool: ...

    def turn(self) -> ContextManager[object]: ...

    def check_open(self) -> None: ...

    def holds(self, generation: "Generation") -> bool: ...

    def release(self, generation: "Generation") -> None: ...

    def invalidate(self) -> None: ...


SUPERSEDED = ("this generation was ended when its thread started another on the same engine (one generation "
              "at a time); iterate each generation to its end, or cancel it, before starting the next")
MEASURING_REASON = "plain: measuring this machine's costs; speculation starts once they are known"


class _Tally:
    """Running counts behind GenerationStats."""

    def __init__(self, prompt_tokens: int, controller: Controller | None = None, n_ctx: int = 0) -> None:
        self.prompt_tokens = prompt_tokens
        self.n_ctx = n_ctx
        self.controller: Controller | None = None
        self.control_before: object = None
        self.measuring_costs = False
        if controller is not None:
            self.attach(controller)
        self.tokens = self.steps = self.drafted = self.accepted = self.verified = 0
        self.prefill_ms = self.draft_ms = self.verify_ms = self.python_ms = 0.0
        self.plain_estimate_ms = 0.0
        self.start = self.end = 0.0
        self.pos_drafted: list[int] = []
        self.pos_accepted: list[int] = []
        self.by_drafter: dict[str, list[int]] = {}

    def attach(self, controller: Controller) -> None:
        """Count the controller's decisions from now on (it may start after the first steps)."""
        self.controller = controller
        self.control_before = controller.stats.copy()

    def add(self, step: StepEvent) -> None:
        self.steps += 1
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.verified += step.verified
        self.draft_ms += step.draft_ms
        self.verify_ms += step.verify_ms
        self.python_ms += step.python_ms
        if self.controller is not None:
            self.plain_estimate_ms += step.emitted * self.controller.observed_plain_ms
        elif self.measuring_costs:  # a plain step while the costs are measured: plain's own time
            self.plain_estimate_ms += step.draft_ms + step.verify_ms + step.python_ms
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
            control=self._control(), n_ctx=self.n_ctx, measuring_costs=self.measuring_costs,
            plain_estimate_ms=self.plain_estimate_ms,
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

    def __init__(self, engine: EngineSide, prompt: list[int], opts: GenerateOptions) -> None:
        self.engine = engine
        self.owner = threading.get_ident()  # the thread that started it (Engine.generate's wait)
        # Held while the loop runs (a step, the prefill): cancel() and Engine.close() never act mid-step.
        self.stepping = threading.Lock()
        self._started = False
        self._superseded = False
        self.prompt = prompt
        self.opts = opts
        # Every row is shaped by the tokens before it (penalties, bias, then the grammar's mask), the
        # draft's as the target's.
        self.sampler = Sampler(opts.sampling, compose(penalty_shaper(opts.penalties, engine.target.n_vocab),
                                                      engine.shaper(opts, len(prompt))))
        self.drafters = engine.make_drafters(self.sampler, opts)
        # Costs this machine has not measured yet are measured in the background (where the engine
        # allows it): the reply starts at once, plain, and speculation starts once they are known.
        self.measuring_costs = bool(self.drafters) and engine.costs_pending()
        """True while the reply decodes plain because the costs are still being measured."""
        self.controller: Controller | None = None
        self.tally = _Tally(len(prompt), None, engine.n_ctx)
        if self.drafters and not self.measuring_costs:
            self._start_controller()
        self.tokens: list[int] = []
        self.text_parts: list[str] = []
        self.result: DoneEvent | None = None
        self.warnings: list[str] = []
        self.cached_tokens = 0  # prompt tokens the prefill found in the cache (the previous turn's prefix)
        self._releaser = TokenReleaser(opts.stop)
        # The log-probabilities of tokens the releaser holds back (a stop string may follow), in order:
        # it releases tokens in the order they came, so each released token takes the oldest.
        self._held_logprobs: deque[TokenLogprob] = deque()
        self._cancel = False
        self._events = self._run()

    def _start_controller(self) -> None:
        self.controller = self.engine.controller()
        self.controller.start(self.drafters, draft_len=self.opts.draft_len, draft_len_limit=self.engine.draft_len_limit,
                              tree_nodes_limit=self.engine.tree_nodes_limit)
        self.tally.attach(self.controller)

    def _costs_arrived(self) -> None:
        """Between steps: once the background measurement is done, the controller takes over."""
        if self.measuring_costs and not self.engine.costs_pending():
            self.measuring_costs = False
            self._start_controller()

    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Event:
        with self.stepping:
            if self._superseded:
                raise EngineStateError(SUPERSEDED)
            if self.result is None:
                self.engine.check_open()  # closed under an unfinished generation: an error, not a crash
            self._started = True
            return next(self._events)

    def cancel(self) -> None:
        """End the generation after its current step, ``finish_reason == "cancelled"``.

        Callable from any thread. When no step is running (between two events, or before the first),
        the engine is released at once, so another generation may start; what is left of this one
        (the rest of the step's tokens, the DoneEvent) touches no cache.
        """
        self._cancel = True
        if self.stepping.acquire(blocking=False):
            try:
                if not self._started:  # nothing decoded yet: end without a prefill
                    self._events.close()
                    self._events = self._finish("cancelled")
                self.engine.release(self)
            finally:
                self.stepping.release()

    def supersede(self) -> None:
        """End this unfinished generation because its thread started another on the same engine
        (``Engine.generate``): between two steps its caches are consistent, so the next one keeps
        what they hold; iterating this one again raises ``EngineStateError``."""
        with self.stepping:
            if self.result is not None:
                return
            self._superseded = True
            self._events.close()
            self.engine.release(self)

    def run(self) -> DoneEvent:
        """Consume the remaining events; the final DoneEvent (for callers that need no streaming)."""
        for _ in self:
            pass
        assert self.result is not None, "a generation always ends with a DoneEvent"
        return self.result

    def stats(self) -> GenerationStats:
        return self.tally.snapshot()

    def interrupted(self) -> DoneEvent:
        """The DoneEvent for a generation stopped by an exception (Ctrl-C, or one in the caller's own
        loop): the caller gives it up, so the engine is free for the next one."""
        if self.result is None:
            self.tally.end = self.tally.end or time.perf_counter()
            self.result = DoneEvent("interrupted", "".join(self.text_parts), tuple(self.tokens), self.stats())
            with self.stepping:
                self._events.close()  # (already finished when the exception came from the loop itself)
                self.engine.release(self)
        return self.result

    # --- the loop's stages ---------------------------------------------------
    def _prefill(self) -> Iterator[PrefillEvent]:
        """Decode the prompt into the target's cache (all but its last token), a batch per turn, with a
        PrefillEvent after each batch of a prompt longer than one; stops early when cancelled. Drafters
        are only reset: a draft model decodes the prompt when the controller first asks it to draft."""
        t0 = time.perf_counter()
        ctx = self.engine.ctx
        history = self.prompt
        with self.engine.turn():
            # Keep whatever prefix the cache already holds (the previous chat turn).
            # A recurrent state drops a suffix only within its last batch; else the prompt is decoded afresh.
            keep = ctx.keepable(ctx.common_prefix(history[:-1]))
            ctx.rollback_to(keep)
        self.cached_tokens = keep  # prompt tokens found in the cache (the server's cached_tokens)
        todo = history[keep:-1]
        total = len(history) - 1
        for start in range(0, len(todo), ctx.n_batch):
            if self._cancel:
                break
            with self.engine.turn():  # a background measurement may take a sample between batches
                ctx.append(todo[start:start + ctx.n_batch])
            if len(todo) > ctx.n_batch:
                yield PrefillEvent(keep + min(start + ctx.n_batch, len(todo)), total)
        for drafter in self.drafters:
            drafter.reset()
        self.tally.start = time.perf_counter()
        self.tally.prefill_ms = (self.tally.start - t0) * 1e3

    def _halt_reason(self) -> str:
        """Why no further step can run ("" when one can)."""
        if self._cancel:
            return "cancelled"
        if len(self.engine.ctx.tokens) < len(self.prompt) - 1:  # the prefill stopped early
            return "cancelled"
        if len(self.engine.ctx.tokens) >= self.engine.ctx.n_ctx:
            return "context"
        return ""

    def _step(self, history: list[int]) -> StepEvent:
        """Plan (the controller's decision, when there is a controller) and take the step."""
        ctx = self.engine.ctx
        index = self.tally.steps + 1
        if self.controller is None:
            return speculative_step(ctx, history, None, self.sampler, 0, index=index,
                                    reason=MEASURING_REASON if self.measuring_costs else "",
                                    logprobs=self.opts.logprobs)
        decision = self.controller.plan(history, room=ctx.n_ctx - len(ctx.tokens) - 1,
                                        remaining=self.opts.max_tokens - len(self.tokens))
        # The controller's own time for this step is the step's Python work too (its lookups are in draft_ms).
        return speculative_step(ctx, history, decision.chosen, self.sampler, decision.draft_len,
                                decision.proposal, decision.proposal_ms, decision.tree_nodes, index=index,
                                reason=decision.reason, planning_ms=decision.planning_ms,
                                logprobs=self.opts.logprobs)

    def _observe(self, step: StepEvent, history: list[int]) -> None:
        if self.controller is not None:
            self.controller.observe(step, history)
        self.tally.add(step)

    def _emit(self, step: StepEvent) -> Iterator[Event]:
        """The step's tokens as events, then the step itself; returns the finish reason ("" to go on)."""
        model = self.engine.target
        releaser, tokens, text_parts, tally = self._releaser, self.tokens, self.text_parts, self.tally
        reason = ""
        lps = step.logprobs
        held = self._held_logprobs
        for i, tok in enumerate(step.tokens):
            if model.is_eog(tok):
                reason = "stop"
                break
            tokens.append(tok)
            tally.tokens += 1
            if lps:
                held.append(lps[i])
            for t, text, src in releaser.push(tok, model.piece(tok), step.drafter if i < step.accepted else None):
                text_parts.append(text)
                yield TokenEvent(t, text, src, held.popleft() if held else None)
            if releaser.stopped:
                reason = "stop"
                break
            if len(tokens) >= self.opts.max_tokens:
                reason = "length"
                break
        yield step
        return reason

    def _finish(self, reason: str) -> Iterator[Event]:
        held = self._held_logprobs
        for t, text, src in self._releaser.finish():
            self.text_parts.append(text)
            yield TokenEvent(t, text, src, held.popleft() if held else None)
        self.tally.end = time.perf_counter()
        self._remember(reason)
        self.result = DoneEvent(reason, "".join(self.text_parts), tuple(self.tokens), self.stats())
        self.engine.release(self)  # done with the caches: the DoneEvent's reader may start another
        yield self.result

    def _remember(self, reason: str) -> None:
        """Add a finished reply to the personal store (when an n-gram drafter keeps one)."""
        if not self.drafters or not self.tokens or reason not in ("stop", "length") or self._cancel:
            return  # (a cancelled generation may no longer own the engine's drafters)
        from localspec.errors import StoreError

        try:
            for drafter in self.drafters:
                drafter.remember_reply(self.tokens, self.prompt)
        except StoreError as err:
            # The reply itself is complete and delivered; only the drafting history missed it.
            self.warnings.append(str(err))

    def _run(self) -> Iterator[Event]:
        try:
            yield from self._prefill()
            history = list(self.prompt)
            reason = ""
            turn = self.engine.turn()
            self.tally.measuring_costs = self.measuring_costs
            while not reason:
                reason = self._halt_reason()
                if reason:
                    break
                if self.measuring_costs:
                    self._costs_arrived()
                    self.tally.measuring_costs = self.measuring_costs
                with turn:  # a background cost measurement waits for the step
                    step = self._step(history)
                    self._observe(step, history)
                reason = yield from self._emit(step)
            yield from self._finish(reason)
        except GeneratorExit:
            # The consumer stopped listening between steps: the caches are consistent.
            raise
        except BaseException:
            # The caches may be mid-step; the next generation starts from scratch.
            if self.engine.holds(self):  # (not after cancel() let it go)
                self.engine.invalidate()
            raise
        finally:
            self.engine.release(self)
