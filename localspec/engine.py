"""The engine: a target model, an optional drafter, and the generation loop.

Everything the front ends (CLI, TUI, Python API) need goes through
``Engine.generate``, which returns a ``Generation``: an iterator of events
(``TokenEvent``, ``StepEvent``, ``DoneEvent``) that also exposes the running
statistics, so a caller interrupted midway can still report them.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from localspec import pairing
from localspec.backend import Context, Grammar, Model
from localspec.chat import Message, content_spans, render_chat
from localspec.drafting.base import Drafter
from localspec.drafting.factory import DrafterFactory, Listener, Lives, Measured, Setup, Wired, factory, kind_of, wire
from localspec.drafting.specs import MTP, DrafterSpec
from localspec.errors import (
    ContextOverflowError,
    EngineStateError,
    InvalidOptionError,
)
from localspec.constraints import GrammarShaper, grammar_text
from localspec.generation import Generation
from localspec.options import GenerateOptions
from localspec.piecewise import PiecewiseTokenizer, SpecialTexts, TokenMemo
from localspec.models.split import DeviceSplit
from localspec.policy.controller import Controller
from localspec.policy.costs import CostModel
from localspec.sampling import RowShaper, Sampler
from localspec.validation import check_load_options


class _Claim:
    """The engine taken by a generation still being built (``owner``: the thread that asked)."""

    def __init__(self) -> None:
        self.owner = threading.get_ident()
        self.stepping = threading.Lock()


class _MeasurementStopped(Exception):
    """The engine is closing: the background measurement ends without a result."""


class _Turn:
    """``Engine.turn()``: a lock the generation and the background measurement take turns with; the
    measurement's thread, entering it while the engine closes, stops (``_MeasurementStopped``)."""

    __slots__ = ("_engine", "_lock")

    def __init__(self, engine: "Engine") -> None:
        self._engine = engine
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()
        engine = self._engine
        if engine._measurer is not None and engine._closing.is_set() and threading.current_thread() is engine._measurer:
            self._lock.release()
            raise _MeasurementStopped

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


# Sequences for multi-branch verification: candidate branches and lookahead's window.
TREE_SEQUENCES = 32
# Message contents whose tokenization chat_tokens remembers (Engine._spells_control): a long chat's messages.
SPELLED_KEPT = 1024
# Rendered chats this long (characters) are tokenized a message at a time (localspec.piecewise); shorter
# ones whole (a few milliseconds at most, and a short prompt never pays for reading the vocabulary).
PIECEWISE_FROM = 4096


BUSY = ("one generation at a time: finish or cancel the first (another thread is still generating with this "
        "engine; localspec.complete waits its turn)")
CLOSED = "the engine is closed; load the model again to generate"
OWN_UNFINISHED = ("this thread has an unfinished generation of this engine; iterate it to its end or call its "
                  "cancel() before localspec.complete (which would otherwise wait for it forever)")


class Engine:
    """A loaded target with its drafters, ready to generate: one user, one generation at a time.

    The target's cache holds one conversation, so two generations never run
    interleaved. A thread that starts a new one while its own previous one is
    unfinished (not run to its DoneEvent, not cancelled: a loop left with
    ``break``) has moved on: the old one ends there, and iterating it again
    raises ``EngineStateError`` (``SUPERSEDED``) instead of mixing the two. While
    another thread's generation is unfinished, ``generate`` raises
    ``EngineStateError`` (``BUSY``), or with ``wait=True`` (what
    ``localspec.complete`` uses) waits for it to end, so ``complete()`` from
    several threads take turns. After ``close()`` every method raises ``EngineStateError``.

    Drafters: ``draft`` (a draft model: one sharing the target's vocabulary or drafting by text,
    Gemma 4's assistant GGUF, an EAGLE-3 or a DFlash/DSpark draft), ``mtp`` (the
    target's own NextN layers; the target must be loaded with ``load_mtp``) and
    the model-free ``specs`` (``ngram``, ``lookahead``, ``rest:STORE``). What may
    run together is judged by ``localspec.pairing``; what each kind is, how its
    context is built and which class drafts, by the table in ``localspec.drafting.factory``.
    """

    def __init__(self, target: Model, *, draft: Model | None = None, specs: Sequence[DrafterSpec] = (),
                 n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512,
                 personal_history: bool = True) -> None:
        check_load_options(n_ctx=n_ctx, n_threads=n_threads)
        self._closed = False
        self._turn = threading.Condition()  # guards _active: the one unfinished generation
        self._active: Generation | _Claim | None = None
        pairing.check_models(target, draft, specs)
        self.target = target
        self.n_threads = n_threads
        self._controller: Controller | None = None
        self._costs: CostModel | None = None
        self.measure_in_background = False
        """True: a generation whose costs this machine has not measured yet starts at once, decoding plain,
        while they are measured on scratch contexts in a thread that takes turns with its steps
        (``turn``); speculation starts once they are known. The CLI and the app set it; an Engine made
        directly measures them before its first drafting generation, as ``controller()`` says."""
        self._measurer: threading.Thread | None = None
        self._measure_failed = False
        self._closing = threading.Event()
        self._turn_guard = _Turn(self)
        self.draft = draft
        # Each drafter's kind (drafting.factory.KINDS): the draft model's first, then mtp, then the lookups.
        entries = [*([DrafterSpec("model", str(draft.path))] if draft is not None else []),
                   *(s for s in specs if s.kind == MTP), *(s for s in specs if s.kind not in ("model", MTP))]
        kinds = [kind_of(spec, draft, by_text=lambda: pairing.draft_by_text(target, draft)) for spec in entries]
        self.draft_by_text = any(kind.by_text for kind in kinds)
        self.pair_notice = (pairing.text_pair_notice(target.name, draft.name)
                            if draft is not None and self.draft_by_text else None)
        """One line for the user when the draft drafts by text (None: it shares the vocabulary, or none)."""
        # Drafts that grow trees when the controller asks take one target sequence per node, and so do a
        # lookup's candidate branches; a recurrent state cannot branch within a batch.
        self._draft_trees = any(kind.trees(draft) for kind in kinds)
        branches = self._draft_trees or any(kind.context is None for kind in kinds)
        n_seq = 1 + TREE_SEQUENCES if branches and target.rollback == "cache" else 1
        self.ctx = Context(target, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, n_seq=n_seq)
        self.personal_history = personal_history
        self._setup = Setup(target, draft, self.ctx, n_ctx, n_batch, n_threads, TREE_SEQUENCES, personal_history)
        self._grammars: dict[str, Grammar] = {}  # compiled grammars by their text (Engine.shaper)
        self._spelled: dict[str, bool] = {}  # message contents -> whether they spell a control token (chat_tokens)
        # chat_tokens' pieces (a message, the template's text between contents) by text; and how it cuts
        # a long chat into them, once the vocabulary is read
        self._pieces = TokenMemo(lambda text, add_special, parse_special: self.target.tokenize(
            text, add_special=add_special, parse_special=parse_special))
        self._piecewise: PiecewiseTokenizer | None = None
        self._piecewise_read = False
        self._chat_lock = threading.Lock()  # chat_tokens from several threads take turns with what it remembers
        # Each kind's context is built right after the target's, before it decodes (the assistant's must be).
        self._wired: list[Wired] = []
        for kind, spec in zip(kinds, entries):
            self._wired.append(wire(kind, self._setup, spec))
        self._factories: dict[str, DrafterFactory] = {w.name: w.make for w in self._wired}
        self._listeners = [w.make for w in self._wired if isinstance(w.make, Listener)]
        """The factories of the drafters that listen to the target's decodes (one lives at a time)."""

    @property
    def draft_ctx(self) -> Context | None:
        """The draft model's own context (None: no draft model with a cache of its own): measured, cached
        and cleared as the target's is."""
        return next((w.context for w in self._wired if w.kind.costs is Measured.MODEL), None)

    def drafter_context(self, name: str) -> object | None:
        """The context the drafter ``name`` (one of ``drafter_names()``) drafts with: a draft model's, the
        assistant's, EAGLE-3's, DFlash's or the MTP head's (None: a model-free lookup, or no such drafter)."""
        return next((w.context for w in self._wired if w.name == name), None)

    def reset_learning(self) -> None:
        """Forget what the drafters and controllers learned (n-gram pools, acceptance estimates).

        The measured costs stay: they belong to the machine. ``localspec bench``
        calls this before each run so that no run profits from an earlier one.
        """
        self.check_open()
        self._controller = None
        for w in self._wired:
            if w.kind.lives is Lives.ENGINE:
                self._factories[w.name] = factory(w.kind, self._setup, w.context, w.spec)

    def cost_model(self, *, measure: bool = True) -> CostModel | None:
        """The costs the controllers plan with (measured or loaded on first use; None if not yet and not
        ``measure``)."""
        self.check_open()
        if self._costs is None and measure:
            self._wait_for_measurer()
        if self._costs is None and measure:
            from localspec.policy.measure import load_or_measure

            target = load_or_measure(self.ctx, n_threads=self.n_threads)
            draft = load_or_measure(self.draft_ctx, n_threads=self.n_threads) if self.draft_ctx is not None else None
            self._costs = self._compose_costs(target, draft)
        return self._costs

    def _compose_costs(self, costs: CostModel, draft: CostModel | None) -> CostModel:
        """The target's verify costs with every drafter's: a draft model's measured, the MTP head's measured
        here, the others' a first guess (``drafting.factory.Kind.costs``), refined by every proposal the
        controller observes."""
        for w in self._wired:
            if w.kind.costs is Measured.MODEL and draft is not None:
                costs.set_model_drafter(w.name, draft)
            elif w.kind.costs is Measured.HEAD:
                from localspec.policy.measure import load_or_measure_mtp

                # The head drafts like a draft model, its catch-up one pass per chained head.
                head_costs = load_or_measure_mtp(w.context, self.ctx, n_threads=self.n_threads)
                costs.set_model_drafter(w.name, head_costs, passes=w.context.n_heads)
            elif w.kind.costs is not None:
                costs.set_draft_cost(*w.kind.costs(costs.verify_ms, w.context, self.target))
        return costs

    # --- costs measured while a generation runs ------------------------------------------------
    def turn(self) -> "_Turn":
        """Held by a generation around its prefill and each step, and by the background measurement around
        each timed sample, so the two never decode at once (a sample taken while a step runs would time
        both) and a step never waits for more than one sample. (One object, entered once a step: cheap.)"""
        return self._turn_guard

    def costs_pending(self) -> bool:
        """True while this machine's costs are being measured in the background (``measure_in_background``):
        the first call starts that when they are neither known nor cached. False once they are known, and
        whenever they will be measured on demand instead (``cost_model``)."""
        if self._costs is not None:
            return False
        if self._measurer is not None:
            if self._measurer.is_alive():
                return True
            self._measurer = None
            return False  # done: the costs are set, or it failed and cost_model() measures (and says why)
        if not self.measure_in_background or self._measure_failed or any(w.kind.costs is Measured.HEAD
                                                                          for w in self._wired):
            return False  # the MTP head is timed against the target's own context: measured on demand
        from localspec.policy.measure import load_cached

        target = load_cached(self.ctx, n_threads=self.n_threads)
        draft = load_cached(self.draft_ctx, n_threads=self.n_threads) if self.draft_ctx is not None else None
        if target is not None and (self.draft_ctx is None or draft is not None):
            self._costs = self._compose_costs(target, draft)
            return False
        self._measurer = threading.Thread(target=self._measure_in_background, name="localspec-costs", daemon=True)
        self._measurer.start()
        return True

    def _measure_in_background(self) -> None:
        try:
            target = self._measure_on_scratch(self.ctx)
            draft = self._measure_on_scratch(self.draft_ctx) if self.draft_ctx is not None else None
            self._costs = self._compose_costs(target, draft)
        except _MeasurementStopped:
            pass
        except Exception:  # noqa: BLE001 - measured again on demand, where the error reaches the caller
            self._measure_failed = True

    def _measure_on_scratch(self, ctx: Context) -> CostModel:
        """``ctx``'s costs (cached under its key), timed on a scratch context over the same weights."""
        from localspec.policy.measure import DEFAULT_KS, DEPTH_CELLS, load_or_measure

        with self.turn():
            scratch = ctx.scratch(n_ctx=min(ctx.n_ctx, DEPTH_CELLS + 2 * max(DEFAULT_KS)))
        try:
            return load_or_measure(ctx, n_threads=self.n_threads, measure_on=scratch, turn=self.turn)
        finally:
            scratch.close()

    @property
    def measuring_in_background(self) -> bool:
        """True while the background measurement (``costs_pending``) is still running; never starts one."""
        return self._measurer is not None and self._measurer.is_alive()

    def _wait_for_measurer(self) -> None:
        if self._measurer is not None:
            self._measurer.join()
            self._measurer = None

    @classmethod
    def load(cls, target: str | Path, draft: str | Path | None = None, *, specs: Sequence[DrafterSpec] = (),
             n_ctx: int = 4096, n_threads: int | None = None, n_gpu_layers: int = -1,
             draft_n_gpu_layers: int = -1, personal_history: bool = True,
             split: DeviceSplit | None = None, draft_split: DeviceSplit | None = None) -> Engine:
        """Check the files from their GGUF metadata first (no weights read), then load.

        ``draft`` is the draft model's GGUF path; ``specs`` the model-free drafters. ``split`` and
        ``draft_split``: the devices each model's offloaded layers go to (None: llama.cpp's choice).
        """
        from localspec.models.gguf_info import read_info

        check_load_options(n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        check_load_options(n_gpu_layers=draft_n_gpu_layers)
        target_info = read_info(target)
        draft_info = read_info(draft) if draft is not None else None
        pairing.check_files(target_info, draft_info, specs)
        use_mtp = any(s.kind == MTP for s in specs)
        # Before anything is allocated: a context too large for this machine is refused in one line.
        from localspec.models.context_fit import check_machine_fits

        check_machine_fits(target_info, draft_info, n_ctx, n_gpu_layers=n_gpu_layers,
                           draft_n_gpu_layers=draft_n_gpu_layers, mtp=use_mtp,
                           devices_named=split is not None or draft_split is not None)
        target_model = Model(target, n_gpu_layers=n_gpu_layers, load_mtp=use_mtp, split=split)
        draft_model = None
        try:
            draft_model = (Model(draft, n_gpu_layers=draft_n_gpu_layers, split=draft_split)
                           if draft is not None else None)
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
        """``text`` as token ids (BOS added when the model wants it); ``text`` must be a str."""
        self.check_open()
        if not isinstance(text, str):
            raise InvalidOptionError(f"the prompt must be text (str), not {type(text).__name__}", param="prompt")
        return self.target.tokenize(text, add_special=True, parse_special=False)

    def chat_tokens(self, messages: Sequence[Message | Mapping[str, Any]],
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Messages rendered with the model's own template, then tokenized: the template's markers as control
        tokens, each message's content as text (a message that spells `<|im_end|>` cannot end its turn).
        ``tools``: OpenAI's function objects, rendered by the template (``localspec.tools``). A chat of
        ``PIECEWISE_FROM`` characters or more is tokenized a message at a time, each message's ids
        remembered, to the same ids as the whole text's (``localspec.piecewise``)."""
        self.check_open()
        listed = isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping))
        messages = list(messages) if listed else []
        if not listed or not all(isinstance(m, (Message, Mapping)) for m in messages):
            raise InvalidOptionError("messages must be a list of messages, e.g. [{\"role\": \"user\", \"content\": "
                                     "\"Hi\"}]", param="messages")
        bos = self.target.token_text(self.target.bos) if self.target.bos >= 0 else ""
        eos = self.target.token_text(self.target.eos) if self.target.eos >= 0 else ""
        text = render_chat(self.target.chat_template(), messages, bos_token=bos, eos_token=eos,
                           model_name=self.target.name, tools=tools)
        # The template may already begin with BOS; never add a second one.
        add_bos = not (bos and text.startswith(bos))
        # Only the template's own markers are control tokens: content that spells one (`<|im_end|>`
        # typed in a message) stays text. Content without any is tokenized with the template as before.
        contents = [m.content if isinstance(m, Message) else str(m.get("content", "")) for m in messages]
        with self._chat_lock:  # what is remembered (the pieces, the spelled contents) is kept by one thread at a time
            if any(self._spells_control(c) for c in contents):
                pieces = content_spans(self.target.chat_template(), messages, text, bos_token=bos, eos_token=eos,
                                       model_name=self.target.name, tools=tools)
                if pieces is not None:  # (each piece's ids remembered: a long chat's turn tokenizes what is new)
                    return [t for i, (piece, content) in enumerate(pieces)
                            for t in self._pieces(piece, add_bos and i == 0, not content)]
            piecewise = self._piecewise_tokenizer() if len(text) >= PIECEWISE_FROM else None
            if piecewise is not None:  # the same ids, tokenizing only the messages not seen before
                return piecewise.tokenize(text, add_bos)
            return self.target.tokenize(text, add_special=add_bos, parse_special=True)

    def _piecewise_tokenizer(self) -> PiecewiseTokenizer | None:
        """The target's chat tokenizer that remembers messages (None where cutting is not known exact)."""
        if not self._piecewise_read:
            self._piecewise_read = True
            texts = self.target.partition_texts()
            self._piecewise = None if texts is None else PiecewiseTokenizer(self._pieces, SpecialTexts(*texts))
        return self._piecewise

    def _spells_control(self, content: str) -> bool:
        """Whether ``content`` tokenizes otherwise when its control-token text is parsed (``<|im_end|>`` typed
        in a message). A chat sends its whole conversation every turn, and tokenizing every message twice
        to tell took 70 ms a turn for 27,000 tokens on a 2-core CPU; the answers are kept by content, so
        a turn tokenizes only the messages it has not seen (of the last ``SPELLED_KEPT`` used)."""
        spelled = self._spelled.pop(content, None)
        if spelled is None:
            tokenize = self.target.tokenize
            spelled = tokenize(content, add_special=False, parse_special=True) != tokenize(content, add_special=False)
        self._spelled[content] = spelled  # (re)inserted: the dict's order is the order of use
        if len(self._spelled) > SPELLED_KEPT:
            del self._spelled[next(iter(self._spelled))]
        return spelled

    # --- generation --------------------------------------------------------
    def drafter_names(self) -> list[str]:
        """The drafters this engine can use; with several, their combination comes first."""
        self.check_open()
        names = list(self._factories)
        return [",".join(names), *names] if len(names) > 1 else names

    @property
    def draft_len_limit(self) -> int | None:
        """The most tokens any step may draft whatever is asked (None: no limit beyond the options').

        The one place where the backend bounds the draft length: a hybrid target
        that rolls back by recurrent-state snapshots takes back at most
        ``Context.max_rollback`` tokens (a draft model's context never rolls back
        past its last batch: a recurrent draft drafts on a sequence copy); under our
        CUDA batch-invariant switch a verification holds at most ``Context.max_verify_rows``
        rows, the last token's among them, so the controller plans no more than it verifies.
        """
        limit = self.ctx.max_rollback
        if self.ctx.cuda_batch_invariant:
            rows = self.ctx.max_verify_rows - 1
            limit = rows if limit is None else min(limit, rows)
        return limit

    @property
    def tree_nodes_limit(self) -> int:
        """The most nodes a tree grown by a drafter (``Drafter.tree_width``) may have: one sequence per
        leaf beside the history's in the target's context (0: no trees, a context of one sequence), and
        no more than a verification may hold under our CUDA batch-invariant switch (``draft_len_limit``)."""
        if not self._draft_trees:
            return 0
        nodes = self.ctx.n_seq - 1
        return min(nodes, self.ctx.max_verify_rows - 1) if self.ctx.cuda_batch_invariant else nodes

    def controller(self) -> Controller:
        """The controller; it keeps learning across generations.

        The first call measures the target's (and draft model's) verification
        costs (a few seconds each: two depths of the context), cached on disk per model and build.
        """
        self.check_open()
        if self._controller is None:
            costs = self.cost_model()
            assert costs is not None
            self._controller = Controller(costs, ends_line=self.target.ends_line)
        return self._controller

    def shaper(self, opts: GenerateOptions, start: int) -> RowShaper | None:
        """What shapes every row of a generation whose history starts ``start`` tokens long: the grammar
        ``opts`` constrains it by (None: nothing). Compiled grammars are kept by their text (a server
        answers one schema many times). ``InvalidOptionError`` for a grammar that does not parse."""
        text = grammar_text(opts.grammar, opts.json_schema)
        if text is None:
            return None
        grammar = self._grammars.get(text)
        if grammar is None:
            if len(self._grammars) >= 8:
                self._grammars.pop(next(iter(self._grammars)))
            grammar = self._grammars[text] = Grammar(self.target, text)
        return GrammarShaper(grammar, start, greedy=opts.sampling.greedy)

    def make_drafters(self, sampler: Sampler, opts: GenerateOptions) -> list[Drafter]:
        """The drafters ``opts`` asks for (all configured ones by default; none for plain decoding)."""
        self.check_open()
        if not opts.speculative or opts.draft_len == 0:
            return []
        wanted = opts.drafter.split(",") if opts.drafter else list(self._factories)
        unknown = [n for n in wanted if n not in self._factories]
        if unknown:  # an engine without drafters too: asking for one is never silently plain decoding
            raise InvalidOptionError(
                f"unknown drafter {unknown[0]!r}; this engine has: {', '.join(self._factories) or 'none'} "
                "(drafters are chosen when the engine is loaded: load(..., draft=...))", param="drafter"
            )
        return [self._factories[n](sampler, opts) for n in wanted]

    def generate(self, prompt: str | Sequence[int], opts: GenerateOptions | None = None, *,
                 wait: bool = False) -> Generation:
        """Start a generation of ``prompt`` (text, or token ids of this model's vocabulary).

        One at a time: this thread's own unfinished generation of this engine ends here (it
        raises ``SUPERSEDED`` if iterated again); another thread's raises ``BUSY``, or with
        ``wait`` is waited for. With ``wait``, this thread's own unfinished generation raises
        ``OWN_UNFINISHED`` instead (waiting for it would never end, and ending it is not asked).
        """
        self.check_open()
        if opts is None:
            opts = GenerateOptions()
        elif not isinstance(opts, GenerateOptions):
            raise InvalidOptionError(f"opts must be a GenerateOptions, not {type(opts).__name__}; build one with "
                                     "GenerateOptions(max_tokens=...) or localspec.api.options(max_tokens=...)",
                                     param="opts")
        opts.validate()
        tokens = self.tokenize(prompt) if isinstance(prompt, str) else self.check_tokens(prompt)
        if not tokens:
            raise InvalidOptionError("the prompt is empty; give some text to continue", param="prompt")
        if len(tokens) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(tokens)} tokens but the context holds {self.n_ctx}; "
                "shorten the prompt or raise --ctx"
            )
        claim = _Claim()
        while True:
            with self._turn:
                active = self._active
                if active is None:
                    self.check_open()  # closed while waiting
                    self._active = claim
                    break
                if active.owner == claim.owner and wait and isinstance(active, Generation):
                    raise EngineStateError(OWN_UNFINISHED)
                if active.owner != claim.owner:
                    if not wait:
                        raise EngineStateError(BUSY)
                    self._turn.wait()
                    continue
            if not isinstance(active, Generation):  # generate() re-entered while building one
                raise EngineStateError(BUSY)
            active.supersede()  # this thread left it unfinished and moved on
        # Built outside the lock: the first generation measures costs (seconds), and a second
        # caller must hear BUSY at once, not wait for the lock.
        try:
            generation = Generation(self, tokens, opts)
        except BaseException:
            self.release(claim)
            raise
        with self._turn:
            self._active = generation
        return generation

    def check_tokens(self, prompt: object) -> list[int]:
        """``prompt`` as a list of this vocabulary's token ids, or one InvalidOptionError naming why not."""
        if isinstance(prompt, (bytes, bytearray, memoryview)):
            raise InvalidOptionError("the prompt is bytes; pass text (str, e.g. data.decode()) or a list of "
                                     "token ids", param="prompt")
        try:
            tokens = list(prompt)  # type: ignore[call-overload]
        except TypeError:
            raise InvalidOptionError(f"the prompt must be text (str) or a list of token ids, not "
                                     f"{type(prompt).__name__}", param="prompt") from None
        n_vocab = self.target.n_vocab
        # The common case in C (a chat's history, tens of thousands of ids, comes every turn: walked in
        # Python it took 3 ms for 12,000): plain ints within the vocabulary. Anything else is walked, to
        # name the first id that is wrong.
        if tokens and set(map(type, tokens)) == {int} and 0 <= min(tokens) and max(tokens) < n_vocab:
            return tokens
        for tok in tokens:
            if isinstance(tok, bool) or not isinstance(tok, int) and not hasattr(tok, "__index__"):
                raise InvalidOptionError(f"the prompt's token {tok!r} is not a token id (an int)", param="prompt")
            if not 0 <= int(tok) < n_vocab:
                raise InvalidOptionError(f"the prompt's token id {int(tok)} is outside the vocabulary: this model "
                                         f"has {n_vocab:,} tokens (ids 0..{n_vocab - 1})", param="prompt")
        return [int(t) for t in tokens]

    # --- one user at a time ----------------------------------------------------
    def check_open(self) -> None:
        """Raise ``EngineStateError`` once ``close()`` was called (llama.cpp's memory is freed)."""
        if self._closed:
            raise EngineStateError(CLOSED)

    def holds(self, generation: Generation) -> bool:
        """Whether ``generation`` has the caches now (it is the one unfinished generation, and the
        engine is open): the only one that may decide they are spoilt (``invalidate``)."""
        return self._active is generation and not self._closed

    def release(self, generation: Generation | _Claim) -> None:
        """A generation has finished with the caches (or let them go); the next one may start."""
        with self._turn:
            if self._active is generation:
                self._active = None
                self._turn.notify_all()

    def invalidate(self) -> None:
        """Forget cache contents after an interruption left them in an unknown state."""
        self.check_open()
        self.ctx.clear()
        if self.draft_ctx is not None:
            self.draft_ctx.clear()
        for listener in self._listeners:
            if listener.current is not None:
                listener.current.reset()

    def close(self) -> None:
        """Free the models and caches; afterwards every method raises ``EngineStateError``.

        A generation mid-step in another thread finishes its step first (llama.cpp's memory is never
        freed under it); it then ends with that error at its next step. Closing twice is harmless.
        """
        self._closing.set()  # a background measurement stops at its next sample
        self._wait_for_measurer()
        with self._turn:
            if self._closed:
                return
            self._closed = True
            active = self._active
        if active is not None:
            with active.stepping:  # wait out a step in progress
                self.release(active)
        for listener in self._listeners:
            listener.close()
        # The drafters' contexts before the target's: the MTP head's, the assistant's, EAGLE-3's and DFlash's
        # were created over it (ctx_other).
        for obj in (*(w.context for w in reversed(self._wired)), self.ctx, self.target, self.draft):
            if obj is not None:
                obj.close()
