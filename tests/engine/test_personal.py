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
from localspec.drafting.personal import CONTEXT_TOKENS, PersonalStore, personal_ngram_drafter
from localspec.drafting.personal_log import FORMAT_VERSION
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
    store = PersonalStore.open(FP, capacity=200, index_tokens=100)
    for seed in range(1, 31):  # 30 documents of 20 tokens: 600 tokens written
        store.add(doc(seed))
        store.save()
        assert len(store) <= 100
    size = store.path.stat().st_size
    assert size < 300 * 4 + 30 * 8 + 200  # never much more than capacity + a quarter
    again = PersonalStore.open(FP, capacity=200, index_tokens=100)
    assert 200 <= again.report.tokens <= 250
    assert again.report.indexed == len(again) == 100 and again.documents == 5
    assert again.lookup(doc(30)[:4], 4) is not None  # the newest is searched
    assert again.lookup(doc(25)[:4], 4) is None  # on disk, but older than the index window
    assert again.lookup(doc(1)[:4], 4) is None
    bigger = PersonalStore.open(FP, capacity=200, index_tokens=1000)
    assert bigger.lookup(doc(25)[:4], 4) is not None
    assert bigger.lookup(doc(1)[:4], 4) is None  # trimmed from the file


def test_a_reply_longer_than_the_bound_keeps_its_end(data_dir: Path) -> None:
    store = PersonalStore.open(FP, capacity=50)
    store.add(list(range(1000, 1100)))
    store.save()
    again = PersonalStore.open(FP, capacity=50)
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


def _five_records(n: int = 31) -> tuple[Path, bytes]:
    """A history of five replies of ``n`` tokens (740 bytes for 31, as in issue 9)."""
    store = PersonalStore.open(FP)
    for seed in range(1, 6):
        store.add(doc(seed, n))
    store.save()
    return store.path, store.path.read_bytes()


def _record_span(data: bytes, i: int, n: int = 31) -> tuple[int, int]:
    first = len(data) - 5 * (8 + 4 * n)
    return first + i * (8 + 4 * n), first + (i + 1) * (8 + 4 * n)


def _seeds(store: PersonalStore) -> list[int]:
    return [int(d[-1]) // 1000 for d in store._docs]


def _warnings(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert all(ln.startswith("localspec: warning: ") for ln in lines), err
    return lines


def test_a_flipped_byte_in_the_first_of_five_records_loses_only_that_record(data_dir: Path, capsys) -> None:
    """Issue 9: one flipped byte in the first record used to make the next save cut
    the file from 740 to 80 bytes, losing four good records, without a word."""
    path, original = _five_records()
    assert len(original) == 740
    start, stop = _record_span(original, 0)
    for i in range(start, stop):  # every byte of the record: its length, its checksum, its tokens
        for leftover in path.parent.glob("*.corrupt-*"):
            leftover.unlink()
        damaged = bytearray(original)
        damaged[i] ^= 0x10
        path.write_bytes(bytes(damaged))
        capsys.readouterr()
        store = PersonalStore.open(FP)
        assert _seeds(store) == [2, 3, 4, 5], i
        assert store.report.documents == 4 and store.report.damaged_bytes == 132, i
        [warning] = _warnings(capsys.readouterr().err)
        assert "was damaged: skipped 132 bytes, kept its 4 good records" in warning
        # Nothing was cut: the damaged original is kept whole beside the repaired file.
        [aside] = path.parent.glob(f"{path.name}.corrupt-*")
        assert aside.read_bytes() == bytes(damaged) and aside.name in warning
        assert path.read_bytes() == original[:start] + original[stop:]
    store.add(doc(6, 31))
    store.save()
    again = PersonalStore.open(FP)
    assert _seeds(again) == [2, 3, 4, 5, 6] and again.report.damaged_bytes == 0
    assert capsys.readouterr().err == ""  # repaired once, quiet after


def test_a_damaged_record_anywhere_is_skipped(data_dir: Path, capsys) -> None:
    path, original = _five_records(20)
    cases = {
        "a token of the middle record": lambda b: b.__setitem__(_record_span(b, 2, 20)[0] + 20, b[0] ^ 0xFF),
        "the middle record's length made huge": lambda b: b.__setitem__(_record_span(b, 2, 20)[0] + 3, 0x7F),
        "the middle record's length made small": lambda b: b.__setitem__(_record_span(b, 2, 20)[0], 3),
        "a token of the last record": lambda b: b.__setitem__(len(b) - 5, 0x55),
    }
    for what, damage in cases.items():
        for leftover in path.parent.glob("*.corrupt-*"):
            leftover.unlink()
        damaged = bytearray(original)
        damage(damaged)
        path.write_bytes(bytes(damaged))
        store = PersonalStore.open(FP)
        lost = 5 if "last" in what else 3
        assert _seeds(store) == [s for s in range(1, 6) if s != lost], what
        assert len(_warnings(capsys.readouterr().err)) == 1, what
        assert len(list(path.parent.glob("*.corrupt-*"))) == 1, what


def test_garbage_between_records_is_skipped(data_dir: Path, capsys) -> None:
    path, original = _five_records(20)
    cut = _record_span(original, 2, 20)[0]
    garbage = np.random.default_rng(5).bytes(1001)  # not even a whole number of words
    path.write_bytes(original[:cut] + garbage + original[cut:])
    store = PersonalStore.open(FP)
    assert _seeds(store) == [1, 2, 3, 4, 5] and store.report.damaged_bytes == 1001
    assert "skipped 1,001 bytes, kept its 5 good records" in _warnings(capsys.readouterr().err)[0]
    assert path.read_bytes() == original


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", None),  # an empty file is an empty history: nothing to move, nothing to say
        (b"this is somebody else's file\n", "bad magic"),
        (b"LSPHIST\0\x01\x00", "header cut short"),
        (b"LSPHIST\0" + (0x01000001).to_bytes(4, "little") + (64).to_bytes(4, "little") + FP.encode(),
         "unknown format version 16777217"),
        (b"LSPHIST\0" + FORMAT_VERSION.to_bytes(4, "little") + (64).to_bytes(4, "little") + FP[:60].encode()
         + b"ffff",
         "another tokenizer's: fingerprint from character 61: …ffff vs …ab12, the file's vs this model's"),
        (b"LSPHIST\0" + FORMAT_VERSION.to_bytes(4, "little") + (64).to_bytes(4, "little") + b"\xff" * 64,
         "unreadable fingerprint"),
    ],
)
def test_a_file_that_is_not_a_usable_history_is_moved_aside(data_dir: Path, capsys, content: bytes,
                                                            why: str | None) -> None:
    path = data_dir / "personal" / f"{FP[:16]}.tokens"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    store = PersonalStore.open(FP)  # never an error: the history is a cache
    assert len(store) == 0 and store.saving
    warnings = _warnings(capsys.readouterr().err)
    asides = list(path.parent.glob("*.corrupt-*"))
    if why is None:
        assert warnings == [] and asides == []
    else:
        [warning] = warnings
        assert f"is not usable ({why}); moved it to {asides[0].name} and started a new one" in warning
        assert asides[0].read_bytes() == content  # kept as it was
    store.add(doc(1))
    store.save()
    assert _seeds(PersonalStore.open(FP)) == [1]


def test_a_newer_format_is_left_alone(data_dir: Path, capsys) -> None:
    path = data_dir / "personal" / f"{FP[:16]}.tokens"
    path.parent.mkdir(parents=True)
    content = b"LSPHIST\0" + (FORMAT_VERSION + 1).to_bytes(4, "little") + (64).to_bytes(4, "little") + FP.encode()
    path.write_bytes(content)
    store = PersonalStore.open(FP)
    [warning] = _warnings(capsys.readouterr().err)
    assert f"format version {FORMAT_VERSION + 1}" in warning and "left it as it is" in warning
    assert not store.saving and len(store) == 0
    assert store.remember([1, 2, 3]) is True  # drafted from in memory this run, never written
    assert store.lookup([1, 2], 1) is not None
    assert path.read_bytes() == content and list(path.parent.glob("*.corrupt-*")) == []


def test_an_unreadable_file_turns_saving_off(data_dir: Path, capsys) -> None:
    path = data_dir / "personal" / f"{FP[:16]}.tokens"
    path.mkdir(parents=True)  # something that cannot be read as a file
    store = PersonalStore.open(FP)
    [warning] = _warnings(capsys.readouterr().err)
    assert "cannot read personal history" in warning and "drafting without it this run" in warning
    assert not store.saving
    store.add([1, 2, 3])
    store.save()  # nothing written, nothing raised
    assert path.is_dir() and store.pending == 0


def test_damage_that_cannot_be_repaired_keeps_the_good_records(data_dir: Path, capsys) -> None:
    path, original = _five_records()
    damaged = bytearray(original)
    damaged[_record_span(original, 0)[0] + 20] ^= 1
    path.write_bytes(bytes(damaged))
    lock = path.with_name(path.name + ".lock")
    lock.unlink()
    lock.mkdir()  # the lock cannot be taken, so nothing can be rewritten
    store = PersonalStore.open(FP)
    [warning] = _warnings(capsys.readouterr().err)
    assert "could not be repaired" in warning and "using its 4 good records" in warning
    assert _seeds(store) == [2, 3, 4, 5] and not store.saving
    store.add(doc(9, 31))
    store.save()
    assert path.read_bytes() == bytes(damaged)  # left exactly as it was


def test_a_repair_that_cannot_be_written_leaves_no_copy_aside(data_dir: Path, capsys, monkeypatch) -> None:
    """Issue 41: a failed repair left a .corrupt-* link that its message did not name."""
    from localspec.drafting import personal

    path, original = _five_records()
    damaged = bytearray(original)
    damaged[_record_span(original, 0)[0] + 20] ^= 1
    path.write_bytes(bytes(damaged))

    def full_disk(path, parts):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(personal, "write_atomically", full_disk)
    store = PersonalStore.open(FP)
    [warning] = _warnings(capsys.readouterr().err)
    assert "could not be repaired (No space left on device)" in warning
    assert _seeds(store) == [2, 3, 4, 5] and not store.saving
    assert path.read_bytes() == bytes(damaged) and list(path.parent.glob("*.corrupt-*")) == []


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
    fp, seed0, count, capacity, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    store = PersonalStore.open(fp, capacity=capacity)
    while not os.path.exists(go):  # start together, so the saves interleave
        time.sleep(0.001)
    for seed in range(seed0, seed0 + count):
        store.add([seed * 1000 + i for i in range(20)])
        store.save()
    """
)


@pytest.mark.parametrize("capacity", [1_000_000, 1500])  # appends only; appends and compactions
def test_two_processes_appending_do_not_corrupt_the_file(data_dir: Path, capacity: int) -> None:
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data_dir)}
    go = data_dir.parent / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, FP, str(seed0), "80", str(capacity), str(go)], env=env)
             for seed0 in (1, 101)]
    time.sleep(0.5)
    go.touch()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    store = PersonalStore.open(FP, capacity=capacity, index_tokens=capacity)
    assert store.report.dropped_bytes == 0
    docs = store._docs
    for d in docs:  # every record whole and in order: seed * 1000 + 0..19
        seed = int(d[-1]) // 1000
        assert d.tolist() == doc(seed)[20 - len(d):]
    seeds = [int(d[-1]) // 1000 for d in docs]
    assert len(set(seeds)) == len(seeds)
    if capacity > 3200:
        assert sorted(seeds) == list(range(1, 81)) + list(range(101, 181))  # no reply lost
    else:
        assert capacity <= store.report.tokens <= capacity * 5 // 4
        assert {80, 180} <= set(seeds)  # both writers' last replies survive compaction
    # Each writer's replies stay in its own order.
    for lo in (1, 101):
        mine = [s for s in seeds if lo <= s < lo + 80]
        assert mine == sorted(mine)


def test_processes_opening_a_damaged_file_together_repair_it_once(data_dir: Path) -> None:
    path, original = _five_records(20)
    damaged = bytearray(original)
    damaged[_record_span(original, 0, 20)[0] + 30] ^= 0x04
    path.write_bytes(bytes(damaged))
    env = {**os.environ, "LOCALSPEC_DATA_DIR": str(data_dir)}
    go = data_dir.parent / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, FP, str(seed0), "40", "1000000", str(go)], env=env,
                              stderr=subprocess.PIPE, text=True) for seed0 in (101, 201, 301)]
    time.sleep(0.5)
    go.touch()
    errs = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    # One of them repaired it and said so; the others found it whole.
    assert sum(len(_warnings(err)) for err in errs) == 1, errs
    [aside] = path.parent.glob("*.corrupt-*")
    assert aside.read_bytes() == bytes(damaged)
    store = PersonalStore.open(FP)
    seeds = _seeds(store)
    assert sorted(seeds) == [2, 3, 4, 5] + list(range(101, 141)) + list(range(201, 241)) + list(range(301, 341))
    assert seeds[:4] == [2, 3, 4, 5] and store.report.damaged_bytes == store.report.dropped_bytes == 0


# --- wiring ------------------------------------------------------------------
def test_personal_ngram_drafter_drafts_a_remembered_reply(data_dir: Path, smollm2_path: Path) -> None:
    first = personal_ngram_drafter(smollm2_path)
    assert isinstance(first, NgramDrafter) and first.name == "ngram" and first.max_branches == 4
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    reply = [40, 41, 42, 43, 44, 45, 46, 47]
    assert first.remember_reply(reply, prompt)
    files = list((data_dir / "personal").glob("*.tokens"))
    assert len(files) == 1

    second = personal_ngram_drafter(smollm2_path)  # a new run: loads the file
    proposal = second.propose(prompt, 8)
    assert isinstance(proposal, Proposal) and proposal.tokens[:4] == (40, 41, 42, 43)
    second.reset()  # a new generation keeps the store
    assert second.propose(prompt, 8).tokens[:4] == (40, 41, 42, 43)

    assert second.remember_reply([7, 7, 7], [3])
    assert PersonalStore.open(second.sources[0].fingerprint).report.documents == 2


def test_history_can_be_turned_off(data_dir: Path, smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSPEC_NO_HISTORY", "1")
    drafter = personal_ngram_drafter(smollm2_path)
    assert drafter.sources == []
    assert drafter.remember_reply([1, 2, 3], []) is False
    store = PersonalStore.open(FP)
    assert store.remember([1, 2, 3]) is False
    assert not (data_dir / "personal").exists()


def test_remember_without_a_store_does_nothing(data_dir: Path) -> None:
    assert NgramDrafter().remember_reply([1, 2, 3], []) is False
    assert PersonalStore.open(FP).remember([]) is False


def test_tokens_must_be_token_ids(data_dir: Path) -> None:
    store = PersonalStore.open(FP)
    with pytest.raises(ValueError):
        store.add([1, -2, 3])
    with pytest.raises(ValueError):
        store.add(np.array([2**31]))


# --- end to end on the real model ----------------------------------------------
def test_a_new_run_drafts_the_previous_reply_from_the_first_step(data_dir: Path, smollm2_path: Path) -> None:
    from greedy import assert_matches_plain, plain_greedy

    from localspec.backend import Model, batch_invariant
    from localspec.drafting.specs import DrafterSpec
    from localspec.engine import Engine, GenerateOptions
    from localspec.events import DoneEvent, StepEvent

    target = Model(smollm2_path)
    engine = Engine(target, specs=[DrafterSpec("ngram")], n_ctx=256)
    prompt = engine.tokenize("List the planets of the solar system in order from the sun:\n1.")
    plain = plain_greedy(target, prompt, 32, n_ctx=256)
    assert len(plain.tokens) >= 24
    earlier = personal_ngram_drafter(smollm2_path)  # a previous run remembers its reply
    assert earlier.remember_reply(plain.tokens, prompt)

    drafter = personal_ngram_drafter(smollm2_path)  # this run loads it from disk
    engine._factories["ngram"] = lambda sampler, opts: drafter  # the engine's ngram drafter, with history
    events = list(engine.generate(prompt, GenerateOptions(max_tokens=32, draft_len=12)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    # Drafted from the very first step: the prompt's tail matches the context kept with the reply.
    assert steps[0].drafter == "ngram" and steps[0].drafted > 0 and steps[0].accepted > 0
    assert_matches_plain(done.tokens, plain, strict=batch_invariant())  # elsewhere up to a near-tie
    if done.tokens == plain.tokens:
        assert done.stats.steps <= len(plain.tokens) / 4  # the reply came from the store, many tokens a step
    engine.close()


def test_generate_keeps_the_good_records_of_a_damaged_history(data_dir: Path, smollm2_path: Path) -> None:
    """Issue 9 as the user met it: a flipped byte in the first of five records, then
    `generate --draft ngram`: four records survive, one warning line, nothing cut;
    a file that is not a history (or is empty) never stops a run."""
    from localspec.models.gguf_info import tokenizer_fingerprint

    fingerprint = tokenizer_fingerprint(smollm2_path)
    store = PersonalStore.open(fingerprint)
    for seed in range(1, 6):
        store.add(doc(seed, 31))
    store.save()
    path = store.path
    damaged = bytearray(path.read_bytes())
    assert len(damaged) == 740
    damaged[_record_span(bytes(damaged), 0)[0] + 50] ^= 0x01
    path.write_bytes(bytes(damaged))

    def generate() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "localspec", "generate", str(smollm2_path), "--draft", "ngram",
                               "-p", "The capital of France is", "--max-tokens", "8"], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "LOCALSPEC_DATA_DIR": str(data_dir)})

    proc = generate()
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    [warning] = [ln for ln in proc.stderr.splitlines() if ln.startswith("localspec: warning: ")]
    assert f"personal history {path} was damaged: skipped 132 bytes, kept its 4 good records" in warning
    [aside] = path.parent.glob("*.corrupt-*")
    assert aside.read_bytes() == bytes(damaged)  # the original, whole
    after = PersonalStore.open(fingerprint)
    assert _seeds(after)[:4] == [2, 3, 4, 5] and after.report.documents == 5  # four kept, the new reply added
    assert path.stat().st_size > 740 - 132

    for content, warned in ((b"not a history at all", True), (b"", False)):
        path.write_bytes(content)
        proc = generate()
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("localspec: warning: ")]
        assert len(warnings) == warned and (not warned or "bad magic" in warnings[0]), proc.stderr
        assert PersonalStore.open(fingerprint).report.documents == 1  # a new history with this reply
