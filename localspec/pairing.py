"""What can run together: a target, its draft and the drafters asked for. Every refusal in one place.

Two moments: ``check_files`` reads only GGUF headers, before any weights load
(a wrong pair costs no minutes of loading; importing this module loads no llama.cpp, so ``plan`` and
``doctor`` judge a pair from its headers alone); ``check_models`` judges what only
a loaded model tells (whether its cache rolls back, whether its MTP layers
came with it), before any context exists. Each refusal is one line: what
cannot run, why, and what to do instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from localspec.drafting.dflash import DFLASH
from localspec.drafting.eagle3 import EAGLE3
from localspec.drafting.specs import MTP, DrafterSpec
from localspec.drafting.by_text import SAME_VOCAB, TEXT_PAIR
from localspec.errors import IncompatibleDraftError, UnsupportedModelError
from localspec.llama_facts import ASSISTANT_TARGETS
from localspec.models.gguf_info import GGUFInfo, check_draft_compatible, text_encoding_problem

if TYPE_CHECKING:
    from localspec.backend import Model

_MTP_FIX = "draft with ngram, lookahead or a draft model instead"


def check_files(target: GGUFInfo, draft: GGUFInfo | None, specs: Sequence[DrafterSpec]) -> str | None:
    """Refuse, from the headers alone, a pair or a drafter that cannot run; the kind of pair that can
    (``pair_kind``; None: no draft model)."""
    refuse_assistant_as_target(target.label, target.architecture)
    kind = None
    if draft is not None:
        kind = pair_kind(target, draft)
        if draft.architecture in ASSISTANT_TARGETS:
            check_assistant(target, draft)
        if draft.architecture == EAGLE3:
            check_eagle3(target, draft)
        if draft.architecture == DFLASH:
            check_dflash(target, draft)
    if any(s.kind == MTP for s in specs):
        _refuse_mtp(target.name, target.architecture, target.n_nextn_layers, target.has_mtp,
                    f"declares {target.n_nextn_layers} MTP layer(s) but this GGUF carries no weights for them "
                    f"(the conversion stripped them); use a GGUF that keeps them, or {_MTP_FIX}")
    return kind


def pair_kind(target: GGUFInfo, draft: GGUFInfo) -> str:
    """How ``draft`` drafts for ``target``: ``SAME_VOCAB`` (llama.cpp's vocabulary rule holds: token ids
    are shared) or ``TEXT_PAIR`` (another tokenizer: the draft's text is re-encoded, ``drafting.by_text``).

    A draft that reads the target's layers or cache (an assistant, EAGLE-3, DFlash) must share its
    vocabulary; so must any draft when either tokenizer cannot encode every text (one line says which).
    """
    try:
        check_draft_compatible(target, draft)
        return SAME_VOCAB
    except IncompatibleDraftError:
        if draft.architecture in ASSISTANT_TARGETS or draft.architecture in (EAGLE3, DFLASH):
            raise
    for info, role in ((draft, "draft"), (target, "target")):
        if problem := text_encoding_problem(info):
            raise IncompatibleDraftError(
                f"draft {draft.label} has another vocabulary than target {target.label}, and it cannot draft by "
                f"text: the {role} {info.label}: {problem}; pick a draft from the target's own family")
    return TEXT_PAIR


def draft_by_text(target: Model, draft: Model) -> bool:
    """Whether the loaded ``draft`` drafts for ``target`` by text (``pair_kind`` from their headers)."""
    from localspec.models.gguf_info import read_info

    return pair_kind(read_info(target.path), read_info(draft.path)) == TEXT_PAIR


def text_pair_notice(target: str, draft: str, better: str | None = None) -> str:
    """The one line that says a draft of another tokenizer drafts by text, and what that costs; ``better``:
    a draft of the target's own family that is known (a registry name), named as the likely better choice."""
    head = (f"draft {draft} has another tokenizer than {target}: it drafts by text (its text re-encoded into "
            f"{target}'s tokens each step); ")
    if better is None:
        return head + f"a draft of {target}'s own family accepts more for less"
    return head + f"--draft {better}, of {target}'s own family, would likely accept more for less"


def check_models(target: Model, draft: Model | None, specs: Sequence[DrafterSpec]) -> None:
    """Refuse, for loaded models, what their caches or their loading make impossible."""
    refuse_assistant_as_target(target.name, target.architecture)
    use_mtp = any(s.kind == MTP for s in specs)
    if use_mtp:
        _refuse_mtp(target.name, target.metadata("general.architecture") or "unknown", target.n_nextn_layers,
                    target.load_mtp, "was loaded without its MTP layers; load it with Model(..., load_mtp=True) "
                    "to draft with them")
    model_free = [s for s in specs if s.kind not in ("model", MTP)]
    if draft is not None or model_free or use_mtp:
        _check_can_roll_back(target, draft)
        _check_can_branch(target, model_free)


def refuse_assistant_as_target(name: str, architecture: str) -> None:
    """An assistant has no cache of its own, an EAGLE-3 draft reads a target's layers: either can only
    draft beside its target."""
    if architecture in (EAGLE3, DFLASH):
        kind = "an EAGLE-3" if architecture == EAGLE3 else "a DFlash"
        raise UnsupportedModelError(
            f"{name} is {kind} draft ({architecture}): it drafts from a target's layer inputs and cannot run "
            "alone; give the target model as the model and this file as --draft")
    if architecture in ASSISTANT_TARGETS:
        want = ASSISTANT_TARGETS[architecture]
        raise UnsupportedModelError(
            f"{name} is an assistant ({architecture}): it drafts from a {want} target's own cache and cannot "
            f"run alone; give the {want} model as the model and this file as --draft")


def check_assistant(target: GGUFInfo, assistant: GGUFInfo) -> None:
    """Refuse a Gemma 4 assistant draft that this build cannot run or that does not fit the target."""
    from localspec.backend import mtp_unavailable_reason
    from localspec.drafting.assistant import check_assistant_fits

    if reason := mtp_unavailable_reason():
        raise UnsupportedModelError(f"the assistant draft {assistant.label} cannot run: {reason}")
    check_assistant_fits(target, assistant)


def check_eagle3(target: GGUFInfo, draft: GGUFInfo) -> None:
    """Refuse an EAGLE-3 draft that this build cannot run or that does not fit the target."""
    from localspec.backend import eagle3_unavailable_reason
    from localspec.drafting.eagle3 import check_eagle3_fits

    if reason := eagle3_unavailable_reason():
        raise UnsupportedModelError(f"the EAGLE-3 draft {draft.label} cannot run: {reason}")
    check_eagle3_fits(target, draft)


def check_dflash(target: GGUFInfo, draft: GGUFInfo) -> None:
    """Refuse a DFlash draft that this build cannot run or that does not fit the target."""
    from localspec.backend import eagle3_unavailable_reason
    from localspec.drafting.dflash import check_dflash_fits

    if reason := eagle3_unavailable_reason():
        raise UnsupportedModelError(f"the DFlash draft {draft.label} cannot run: "
                                    + reason.replace("an EAGLE-3 draft", "a DFlash draft"))
    check_dflash_fits(target, draft)


def _refuse_mtp(name: str, architecture: str, n_nextn_layers: int, has_weights: bool, no_weights: str) -> None:
    """Refuse ``mtp`` for a target without usable NextN layers (``no_weights``: why its weights are missing)."""
    from localspec.backend import mtp_unavailable_reason

    reason = mtp_unavailable_reason()
    if reason is not None:
        raise UnsupportedModelError(f"drafting with mtp is unavailable: {reason}")
    if n_nextn_layers < 1:
        raise UnsupportedModelError(
            f"{name} has no MTP (NextN) layers ({architecture}.nextn_predict_layers is absent), "
            f"so it cannot draft for itself; {_MTP_FIX}")
    if not has_weights:
        raise UnsupportedModelError(f"{name} {no_weights}")


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
