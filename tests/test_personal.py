"""The personal store of past outputs: file format, bounds, recovery, concurrency, and drafting from it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from localspec.drafting.base import Proposal
from localspec.drafting.ngram import NgramDrafter
from localspec.drafting.personal import (
    CONTEXT_TOKENS,
    FORMAT_VERSION,
    PersonalStore,
    personal_ngram_drafter,
    remember,
)
from localspec.errors import StoreError

FP = "ab12" * 16  # a fingerprint-shaped string: 64 hex digits


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOCALSPEC_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("LOCALSPEC_NO_HISTORY", raising=False)
    return tmp_path / "data"


def doc(seed: int, n: int = 20) -> list[int]:
    """A document whose tokens identify it: seed * 1000 + position."""
    return [seed * 1000 + i for i in range(n)]


def test_add_then_lookup_then_reopen(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    assert len(store) == 0 and store.lookup([1, 2, 3], 8) is None
    store.add([10, 11, 12, 13, 14, 15, 16])
    found = store.lookup([99, 10, 11, 12], 3)
    assert found is not None and found.match_len == 3
    assert found.candidates[0].tokens == (13, 14, 15)
    store.save()
    assert store.path == data_dir / "personal" / f"{FP[:16]}.tokens"

    again = PersonalStore.open(FP)
    assert again.report.documents == 1 and again.report.tokens == 7 and again.report.dropped_bytes == 0
    assert again.lookup([99, 10, 11, 12], 3) == found


def test_recent_occurrences_rank_first(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    store.add([5, 6, 7, 100])
    store.add([5, 6, 7, 200])
    found = store.lookup([5, 6, 7], 1)
    assert found is not None and found.occurrences == 2
    assert found.candidates[0].tokens == (200,)  # equal counts: the more recent wins


def test_context_is_kept_before_the_reply(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    prompt = list(range(500, 520))
    store.add([1, 2, 3, 4], context=prompt)
    found = store.lookup(prompt, 4)  # a new run with the same prompt: drafts the reply at once
    assert found is not None and found.candidates[0].tokens == (1, 2, 3, 4)
    assert found.match_len == CONTEXT_TOKENS  # only the prompt's tail was kept
    assert len(store) == CONTEXT_TOKENS + 4


def test_separators_keep_ngrams_within_a_reply(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    store.add([1, 2, 3, 4])
    store.add([5, 6, 7])
    assert store.lookup([3, 4], 4) is None  # [3, 4] ends a reply: what follows belongs to another
    found = store.lookup([1, 2, 3], 4)
    assert found is not None and found.candidates[0].tokens == (4,)  # cut at the end of the reply
    crossing = store.lookup([3, 4, 5], 2)
    assert crossing is not None and crossing.match_len == 1  # only [5] matches, never [4, 5]
    assert crossing.candidates[0].tokens == (6, 7)


def test_size_is_bounded_and_the_oldest_go_first(data_dir: Path) -> None:
    store = PersonalStore.open(FP, max_tokens=200, index_tokens=100)
    for seed in range(1, 31):  # 30 documents of 20 tokens: 600 tokens written
        store.add(doc(seed))
        store.save()
        assert len(store) <= 100
    size = store.path.stat().st_size
    assert size < 300 * 4 + 30 * 8 + 200  # never much more than max_tokens + a quarter
    again = PersonalStore.open(FP, max_tokens=200, index_tokens=100)
    assert 200 <= again.report.tokens <= 250
    assert again.report.indexed == len(again) == 100 and again.documents == 5
    assert again.lookup(doc(30)[:4], 4) is not None  # the newest is searched
    assert again.lookup(doc(25)[:4], 4) is None  # on disk, but older than the index window
    assert again.lookup(doc(1)[:4], 4) is None
    bigger = PersonalStore.open(FP, max_tokens=200, index_tokens=1000)
    assert bigger.lookup(doc(25)[:4], 4) is not None
    assert bigger.lookup(doc(1)[:4], 4) is None  # trimmed from the file


def test_a_reply_longer_than_the_bound_keeps_its_end(data_dir: Path) -> None:
    store = PersonalStore.open(FP, max_tokens=50)
    store.add(list(range(1000, 1100)))
    store.save()
    again = PersonalStore.open(FP, max_tokens=50)
    assert again.report.tokens == 50 and len(again) == 50
    assert again.lookup([1060, 1061], 2).candidates[0].tokens == (1062, 1063)
    assert again.lookup([1000, 1001], 2) is None


def test_a_torn_tail_is_skipped_then_cut_by_the_next_save(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    for seed in (1, 2, 3):
        store.add(doc(seed))
    store.save()
    good = store.path.stat().st_size
    with open(store.path, "ab") as f:  # a writer that died mid-record
        f.write(b"\x14\x00\x00\x00\xde\xad\xbe\xef" + b"\x01\x00")
    torn = PersonalStore.open(FP)
    assert torn.report.documents == 3 and torn.report.dropped_bytes == 10
    assert torn.lookup(doc(3)[:3], 3) is not None
    torn.add(doc(4))
    torn.save()
    assert store.path.stat().st_size == good + 8 + 20 * 4
    healed = PersonalStore.open(FP)
    assert healed.report.documents == 4 and healed.report.dropped_bytes == 0


def test_a_damaged_record_ends_what_is_read(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    for seed in (1, 2, 3):
        store.add(doc(seed))
    store.save()
    raw = bytearray(store.path.read_bytes())
    header = len(raw) - 3 * (8 + 80)
    raw[header + (8 + 80) + 8 + 5] ^= 0xFF  # a token of the second record
    store.path.write_bytes(bytes(raw))
    damaged = PersonalStore.open(FP)
    # The first record is kept; from the damaged one on nothing is trusted (never misread).
    assert damaged.report.documents == 1 and damaged.report.dropped_bytes == 2 * (8 + 80)
    assert damaged.lookup(doc(1)[:3], 3) is not None and damaged.lookup(doc(3)[:3], 3) is None


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"this is somebody else's file\n", "bad magic"),
        (b"LSPHIST\0" + (FORMAT_VERSION + 1).to_bytes(4, "little") + (64).to_bytes(4, "little") + FP.encode(),
         "format version"),
        (b"LSPHIST\0" + FORMAT_VERSION.to_bytes(4, "little") + (64).to_bytes(4, "little") + b"f" * 64,
         "another tokenizer"),
    ],
)
def test_a_file_that_is_not_ours_is_a_clear_error(data_dir: Path, content: bytes, needle: str) -> None:
    path = data_dir / "personal" / f"{FP[:16]}.tokens"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(StoreError) as err:
        PersonalStore.open(FP)
    message = str(err.value)
    assert needle in message and "LOCALSPEC_NO_HISTORY=1" in message and "\n" not in message
    assert path.read_bytes() == content  # never overwritten


def test_an_unwritable_folder_is_a_clear_error(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    data_dir.mkdir()
    (data_dir / "personal").write_text("a file where the folder should be")
    store.add([1, 2, 3])
    with pytest.raises(StoreError, match="cannot save personal history"):
        store.save()
    assert store.pending == 1 and store.lookup([1, 2], 1) is not None  # kept in memory


WRITER = textwrap.dedent(
    """
    import os, sys, time
    from localspec.drafting.personal import PersonalStore
    fp, seed0, count, max_tokens, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    store = PersonalStore.open(fp, max_tokens=max_tokens)
    while not os.path.exists(go):  # start together, so the saves interleave
        time.sleep(0.001)
    for seed in range(seed0, seed0 + count):
        store.add([seed * 1000 + i for i in range(20)])
        store.save()
    """
)


@pytest.mark.parametrize("max_tokens", [1_000_000, 1500])  # appends only; appends and compactions
def test_two_processes_appending_do_not_corrupt_the_file(data_dir: Path, max_tokens: int) -> None:
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data_dir)}
    go = data_dir.parent / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, FP, str(seed0), "80", str(max_tokens), str(go)], env=env)
             for seed0 in (1, 101)]
    time.sleep(0.5)
    go.touch()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store = PersonalStore.open(FP, max_tokens=max_tokens, index_tokens=max_tokens)
    assert store.report.dropped_bytes == 0
    docs = store._docs
    for d in docs:  # every record whole and in order: seed * 1000 + 0..19
        seed = int(d[-1]) // 1000
        assert d.tolist() == doc(seed)[20 - len(d):]
    seeds = [int(d[-1]) // 1000 for d in docs]
    assert len(set(seeds)) == len(seeds)
    if max_tokens > 3200:
        assert sorted(seeds) == list(range(1, 81)) + list(range(101, 181))  # no reply lost
    else:
        assert max_tokens <= store.report.tokens <= max_tokens * 5 // 4
        assert {80, 180} <= set(seeds)  # both writers' last replies survive compaction
    # Each writer's replies stay in its own order.
    for lo in (1, 101):
        mine = [s for s in seeds if lo <= s < lo + 80]
        assert mine == sorted(mine)


# --- wiring ------------------------------------------------------------------
def test_personal_ngram_drafter_drafts_a_remembered_reply(data_dir: Path, smollm2_path: Path) -> None:
    first = personal_ngram_drafter(smollm2_path)
    assert isinstance(first, NgramDrafter) and first.name == "ngram" and first.max_branches == 4
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    reply = [40, 41, 42, 43, 44, 45, 46, 47]
    assert remember(first, reply, context=prompt)
    files = list((data_dir / "personal").glob("*.tokens"))
    assert len(files) == 1

    second = personal_ngram_drafter(smollm2_path)  # a new run: loads the file
    proposal = second.propose(prompt, 8)
    assert isinstance(proposal, Proposal) and proposal.tokens[:4] == (40, 41, 42, 43)
    second.reset()  # a new generation keeps the store
    assert second.propose(prompt, 8).tokens[:4] == (40, 41, 42, 43)

    assert remember(second, [7, 7, 7], context=[3])
    assert PersonalStore.open(second.sources[0].fingerprint).report.documents == 2


def test_history_can_be_turned_off(data_dir: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    drafter = personal_ngram_drafter(smollm2_path)
    assert drafter.sources == []
    assert remember(drafter, [1, 2, 3]) is False
    store = PersonalStore.open(FP)
    assert remember(store, [1, 2, 3]) is False
    assert not (data_dir / "personal").exists()


def test_remember_without_a_store_does_nothing(data_dir: Path) -> None:
    assert remember(NgramDrafter(), [1, 2, 3]) is False
    assert remember(None, [1, 2, 3]) is False
    assert remember(PersonalStore.open(FP), []) is False


def test_tokens_must_be_token_ids(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    with pytest.raises(ValueError):
        store.add([1, -2, 3])
    with pytest.raises(ValueError):
        store.add(np.array([2**31]))


# --- end to end on the real model ----------------------------------------------
@pytest.mark.slow
def test_a_new_run_drafts_the_previous_reply_from_the_first_step(data_dir: Path, smollm2_path: Path) -> None:
    from greedy import assert_matches_plain, plain_greedy

    from localspec.backend import Model
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions
    from localspec.events import DoneEvent, StepEvent

    target = Model(smollm2_path)
    engine = Engine(target, specs=[DrafterSpec("ngram")], n_ctx=256)
    prompt = engine.tokenize("List the planets of the solar system in order from the sun:\n1.")
    plain = plain_greedy(target, prompt, 32, n_ctx=256)
    assert len(plain.tokens) >= 24
    earlier = personal_ngram_drafter(smollm2_path)  # a previous run remembers its reply
    assert remember(earlier, plain.tokens, context=prompt)

    drafter = personal_ngram_drafter(smollm2_path)  # this run loads it from disk
    engine._factories["ngram"] = lambda sampler, opts: drafter  # the engine's ngram drafter, with history
    events = list(engine.generate(prompt, GenerateOptions(max_tokens=32, draft_len=12)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    # Drafted from the very first step: the prompt's tail matches the context kept with the reply.
    assert steps[0].drafter == "ngram" and steps[0].drafted > 0 and steps[0].accepted > 0
    if assert_matches_plain(done.tokens, plain):  # identical, or parted at a numerical near-tie
        assert done.stats.steps <= len(plain.tokens) / 4  # the reply came from the store, many tokens a step
    engine.close()
