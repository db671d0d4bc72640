"""The pairing rules of drafts that read the target's layers (EAGLE-3, DFlash), on header records alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from localspec.commands.models import traits
from localspec.drafting.dflash import check_dflash_fits
from localspec.drafting.eagle3 import check_eagle3_fits
from localspec.errors import IncompatibleDraftError
from localspec.models.registry import ModelSpec


def info(label: str, architecture: str, *, n_layers: int = 32, n_embd: int = 4096, n_vocab: int = 128256,
         token_embd_bytes: int = 1, output_bytes: int = 1, tensor_names: frozenset[str] = frozenset(),
         **hparams) -> SimpleNamespace:  # noqa: ANN003
    return SimpleNamespace(label=label, architecture=architecture, n_layers=n_layers, n_embd=n_embd, n_vocab=n_vocab,
                           token_embd_bytes=token_embd_bytes, output_bytes=output_bytes, hparams=hparams,
                           tensor_names=tensor_names)


TARGET = info("llama-8b", "llama")


def eagle3(**kw) -> SimpleNamespace:  # noqa: ANN003
    hp = {"target_layers": [2, 16, 29], "target_hidden_size": 4096}
    hp.update(kw.pop("hp", {}))
    return info("eagle3-8b", "eagle3", n_layers=1, **kw, **hp)


def test_a_fitting_eagle3_draft_passes():
    check_eagle3_fits(TARGET, eagle3())
    check_eagle3_fits(TARGET, eagle3(n_embd=2048, token_embd_bytes=5, output_bytes=5))  # its own matrices


@pytest.mark.parametrize("target, draft, message", [
    (info("glm", "glm4moe"), eagle3(), "cannot hand a glm4moe target's layer inputs"),
    (TARGET, eagle3(hp={"target_layers": [2, 16]}), "names 2 target layers"),
    (TARGET, eagle3(hp={"target_layers": [2, 16, 32]}), r"reads layer\(s\) 32, the target has layers 0..31"),
    (TARGET, eagle3(hp={"target_hidden_size": 5120}), "reads features 5120 wide, the target's are 4096"),
    (TARGET, eagle3(n_vocab=32000), "vocabulary size differs"),
    (TARGET, eagle3(n_embd=2048, token_embd_bytes=0), "borrows the target's token embedding but is 2048 wide"),
])
def test_eagle3_drafts_that_do_not_fit_are_refused_in_one_line(target, draft, message):
    with pytest.raises(IncompatibleDraftError, match=message) as err:
        check_eagle3_fits(target, draft)
    assert "\n" not in str(err.value)


MARKOV = frozenset({"markov_w1.weight", "markov_w2.weight"})  # DSpark's Markov head


def dflash(**kw) -> SimpleNamespace:  # noqa: ANN003
    hp = {"target_layers": [1, 8, 15, 22, 29], "block_size": 16}
    hp.update(kw.pop("hp", {}))
    return info("dflash-8b", "dflash", n_layers=5, **kw, **hp)


@pytest.mark.parametrize("target, draft, message", [
    (TARGET, dflash(n_embd=2048), "reads features 2048 wide"),
    (TARGET, dflash(hp={"target_layers": []}), "names no target layers"),
    (TARGET, dflash(hp={"selector_top_k": 4}), "DFlash-2"),
    (TARGET, dflash(hp={"hyper_connection_count": 4}, tensor_names=MARKOV), "DeepSeek-V4"),
    (TARGET, dflash(hp={"block_size": None}, tensor_names=MARKOV), "DSpark draft without its trained block size"),
    (info("mamba", "mamba"), dflash(), "cannot hand a mamba target's layer inputs"),
])
def test_dflash_drafts_that_do_not_fit_are_refused_in_one_line(target, draft, message):
    check_dflash_fits(TARGET, dflash())
    check_dflash_fits(TARGET, dflash(tensor_names=MARKOV))  # a DSpark draft fits as well
    with pytest.raises(IncompatibleDraftError, match=message):
        check_dflash_fits(target, draft)


def test_the_models_table_names_the_kind_of_draft():
    spec = ModelSpec(name="qwen3-8b-dflash", family="qwen3", params="1B", context=32768, arch="dflash")
    assert traits(spec) == ["dflash"]
    assert traits(ModelSpec(name="x", family="llama3", params="0.1B", context=2048, arch="eagle3")) == ["eagle3"]
