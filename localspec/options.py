"""What one generation is asked for: ``GenerateOptions``, checked in one place.

It lives below the engine, its generation and the drafter factory, which all read it, so none of
them imports another upward for it (``localspec.engine.GenerateOptions`` is the same class).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from localspec.constraints import grammar_text
from localspec.errors import InvalidOptionError
from localspec.logprobs import check_top_logprobs
from localspec.penalties import Penalties
from localspec.policy.controller import check_draft_len
from localspec.sampling import SamplingParams
from localspec.validation import is_int, is_real, out_of_range


@dataclass(frozen=True)
class GenerateOptions:
    """How to generate.

    ``draft_len`` is gamma, a fixed number of tokens drafted per step (up to
    ``localspec.policy.controller.DRAFT_LEN_MAX``); None (the default) lets the controller choose each step
    from the measured costs and acceptance, including 0 (plain decoding) when
    drafting would not pay. ``p_min``: a draft model stops drafting where its own
    top probability falls below it.

    ``grammar`` (GBNF text) or ``json_schema`` (a JSON Schema as a mapping or JSON text; True: any
    JSON object) constrains the output: every row, verified or drafted, is masked by the grammar's state
    after the tokens before it, so speculation stays exact (``localspec.constraints``). A grammar that
    cannot finish within ``max_tokens`` ends with ``finish_reason == "length"``.
    """

    max_tokens: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    draft_len: int | None = None
    p_min: float = 0.0
    speculative: bool = True
    drafter: str | None = None  # from Engine.drafter_names() (a comma list combines); None: all configured
    grammar: str | None = None
    json_schema: object = None
    logprobs: int | None = None
    """Each TokenEvent's ``logprob`` with this many alternatives (0..20; None: none, and no work for them)."""
    penalties: Penalties | None = None
    """Repetition penalties and logit bias, applied to every target row (None: none)."""

    def __post_init__(self) -> None:
        # One stop string given alone is that string, not its characters.
        # None is no stop string (as OpenAI's API takes it); anything else not iterable is left for validate.
        if self.stop is None:
            object.__setattr__(self, "stop", ())
        elif isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple) and isinstance(self.stop, Iterable):
            object.__setattr__(self, "stop", tuple(self.stop))

    def validate(self) -> None:
        """Raise ``InvalidOptionError`` naming the first option of a wrong type or out of range."""
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidOptionError(f"sampling must be a SamplingParams, not {type(self.sampling).__name__}",
                                     param="sampling")
        self.sampling.validate()
        if not isinstance(self.stop, tuple):
            raise InvalidOptionError(f"stop must be a string or a list of strings, not {type(self.stop).__name__}",
                                     param="stop")
        check_top_logprobs(self.logprobs)
        if self.penalties is not None:
            self.penalties.validate()
        bad = next((s for s in self.stop if not isinstance(s, str) or not s), None)
        if bad is not None:
            raise InvalidOptionError(f"stop {bad!r} is not a stop string: give non-empty text", param="stop")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise out_of_range("max_tokens", self.max_tokens, "an integer >= 1", "e.g. 256")
        check_draft_len(self.draft_len)
        if not is_real(self.p_min) or not 0.0 <= self.p_min < 1.0:
            raise out_of_range("p_min", self.p_min, "in [0, 1)", "0 switches it off")
        if not isinstance(self.speculative, bool):
            raise InvalidOptionError(f"speculative must be True or False, not {self.speculative!r}",
                                     param="speculative")
        if self.drafter is not None and not isinstance(self.drafter, str):
            raise InvalidOptionError(f"drafter must be a drafter's name (str) or None, not "
                                     f"{type(self.drafter).__name__}", param="drafter")
        grammar_text(self.grammar, self.json_schema)  # both given, or a schema the converter cannot express
