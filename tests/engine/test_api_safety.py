"""The Python API used carelessly (issue 33): a closed engine, two generations at once, odd prompts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import localspec
from localspec import GenerateOptions, TokenEvent
from localspec.errors import EngineStateError, InvalidOptionError, LocalspecError
from localspec.events import DoneEvent

A, B = "The three primary colours are", "Once upon a time, in a small village,"


@pytest.fixture(scope="module")
def engine(smollm2_path):
    eng = localspec.load(smollm2_path, n_ctx=512, n_gpu_layers=0, n_threads=1)
    yield eng
    eng.close()


def test_an_engine_used_after_close_raises_instead_of_crashing(smollm2_path: Path):
    """It segfaulted (exit 139): in a child process, so a crash is a failure, not the end of the run."""
    script = textwrap.dedent(f"""
        import localspec
        from localspec.errors import EngineStateError
        e = localspec.load({str(smollm2_path)!r}, n_ctx=256, n_gpu_layers=0, n_threads=1)
        unfinished = e.generate("Hello", localspec.GenerateOptions(max_tokens=8, speculative=False))
        next(unfinished)
        e.close()
        e.close()  # twice is harmless
        calls = {{
            "complete": lambda: localspec.complete(e, "Hi"),
            "generate": lambda: e.generate("Hi"),
            "tokenize": lambda: e.tokenize("Hi"),
            "chat_tokens": lambda: e.chat_tokens([{{"role": "user", "content": "Hi"}}]),
            "cost_model": lambda: e.cost_model(),
            "controller": lambda: e.controller(),
            "drafter_names": lambda: e.drafter_names(),
            "reset_learning": lambda: e.reset_learning(),
            "invalidate": lambda: e.invalidate(),
            "make_drafters": lambda: e.make_drafters(None, localspec.GenerateOptions()),
            "next step": lambda: next(unfinished),
        }}
        for name, call in calls.items():
            try:
                call()
            except EngineStateError as err:
                print(name, "|", err)
            else:
                print(name, "| no error")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 11
    for line in lines:
        assert line.endswith("| the engine is closed; load the model again to generate"), line


def test_two_generations_iterated_in_turn_never_mix(engine):
    """Issue 33: two generations from one engine iterated in turn gave wrong text with no error."""
    plain = GenerateOptions(max_tokens=12, speculative=False)
    alone_a = engine.generate(A, plain).run().text
    alone_b = engine.generate(B, plain).run().text
    first = engine.generate(A, plain)
    next(first)
    second = engine.generate(B, plain)  # this thread moved on: the first ends here
    with pytest.raises(EngineStateError, match="this generation was ended when its thread started another"):
        next(first)
    assert second.run().text == alone_b  # the second is its own text, whole
    with pytest.raises(EngineStateError, match="was ended"):
        next(first)
    ended = first.interrupted()  # what the first gave before it ended is still there
    assert ended.finish_reason == "interrupted" and alone_a.startswith(ended.text)
    # A loop left with `break` needs no ceremony: the next generation simply starts.
    for event in engine.generate(A, plain):
        if isinstance(event, TokenEvent) and event.text:
            break
    assert engine.generate(A, plain).run().text == alone_a


def test_another_threads_unfinished_generation_is_busy(engine):
    plain = GenerateOptions(max_tokens=12, speculative=False)
    alone_b = engine.generate(B, plain).run().text
    first = engine.generate(A, plain)
    next(first)
    seen: list[object] = []

    def other() -> None:
        try:
            engine.generate(B, plain)
        except EngineStateError as err:
            seen.append(str(err))

    t = threading.Thread(target=other)
    t.start()
    t.join(timeout=60)
    assert seen == ["one generation at a time: finish or cancel the first (another thread is still generating "
                    "with this engine; localspec.complete waits its turn)"]
    # complete() from another thread waits for the first to finish, then runs on a clean turn.
    results: list[str] = []
    waiter = threading.Thread(target=lambda: results.append(
        localspec.complete(engine, B, max_tokens=12, speculative=False).text))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive() and results == []  # still waiting: the first is unfinished
    rest = first.run()
    waiter.join(timeout=120)
    assert results == [alone_b] and rest.finish_reason in ("length", "stop")


def test_cancel_lets_the_next_generation_start(engine):
    plain = GenerateOptions(max_tokens=40, speculative=False)
    alone_b = engine.generate(B, GenerateOptions(max_tokens=12, speculative=False)).run().text
    first = engine.generate(A, plain)
    for event in first:
        if isinstance(event, TokenEvent) and event.text:
            break
    first.cancel()
    second = engine.generate(B, GenerateOptions(max_tokens=12, speculative=False)).run()
    assert second.text == alone_b
    rest = list(first)  # what was left of the cancelled one ends it without touching the cache
    assert isinstance(rest[-1], DoneEvent) and rest[-1].finish_reason == "cancelled"
    never_started = engine.generate(A, plain)
    never_started.cancel()
    done = never_started.run()
    assert done.finish_reason == "cancelled" and done.tokens == ()


def test_complete_from_two_threads_takes_turns(engine):
    """Two threads gave wrong text, one of them `llama_decode failed with code -1`."""
    expected = {p: localspec.complete(engine, p, max_tokens=24, speculative=False).text for p in (A, B)}
    results: dict[str, list[str]] = {A: [], B: []}
    errors: list[BaseException] = []

    def worker(prompt: str) -> None:
        try:
            for _ in range(3):
                results[prompt].append(localspec.complete(engine, prompt, max_tokens=24, speculative=False).text)
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(p,)) for p in (A, B)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results == {A: [expected[A]] * 3, B: [expected[B]] * 3}


def test_prompts_that_are_not_text_or_token_ids_are_refused(engine):
    with pytest.raises(InvalidOptionError, match="the prompt is bytes; pass text"):
        localspec.complete(engine, b"Hi")
    n_vocab = engine.target.n_vocab
    for bad in ([-1], [10**9], [1, 2, n_vocab]):
        with pytest.raises(InvalidOptionError) as err:
            localspec.complete(engine, bad, max_tokens=4)
        assert f"this model has {n_vocab:,} tokens (ids 0..{n_vocab - 1})" in str(err.value)
    with pytest.raises(InvalidOptionError, match="not a token id"):
        localspec.complete(engine, [1, "2"], max_tokens=4)
    ids = engine.tokenize(A)
    assert localspec.complete(engine, ids, max_tokens=6).text == localspec.complete(engine, A, max_tokens=6).text


def test_one_stop_string_is_one_string(engine):
    text = localspec.complete(engine, A, max_tokens=40, speculative=False).text
    word = text.split()[2]  # a word of the reply: the reply must stop right before it
    done = localspec.complete(engine, A, max_tokens=40, speculative=False, stop=word)
    assert done.finish_reason == "stop"
    assert done.text == text[:text.index(word)]  # up to the whole word, not to its first letter
    assert GenerateOptions(stop="party").stop == ("party",)
    assert localspec.api.options(stop="party").stop == ("party",)


def test_load_refuses_none_and_resolves_registered_names(smollm2_path):
    with pytest.raises(InvalidOptionError, match="target must be a GGUF path or a model name"):
        localspec.load(None)  # type: ignore[arg-type]
    with pytest.raises(LocalspecError, match="unknown model|Unknown model|no model named"):
        localspec.load("no-such-model-xyz")
    eng = localspec.load("smollm2-135m", n_ctx=256, n_gpu_layers=0, offline=True)
    try:
        assert eng.target.path.name == smollm2_path.name
    finally:
        eng.close()


def test_a_generation_given_up_after_an_error_in_the_callers_loop_frees_the_engine(engine):
    """The app's worker calls interrupted() when its own code fails mid-reply; the next reply comes from
    another thread and must not find the engine busy."""
    plain = GenerateOptions(max_tokens=12, speculative=False)
    alone_b = engine.generate(B, plain).run().text
    gen = engine.generate(A, plain)
    next(gen)
    done = gen.interrupted()
    assert done.finish_reason == "interrupted"
    results: list[str] = []
    t = threading.Thread(target=lambda: results.append(engine.generate(B, plain).run().text))
    t.start()
    t.join(timeout=120)
    assert results == [alone_b]


def test_complete_inside_this_threads_unfinished_generation_raises_as_documented(engine):
    """Issue 41: complete() ended this thread's unfinished generation and ran, where its docstring says it
    raises (waiting would never end, and ending the caller's generation was not asked)."""
    plain = GenerateOptions(max_tokens=12, speculative=False)
    alone_a = engine.generate(A, plain).run().text
    first = engine.generate(A, plain)
    next(first)
    with pytest.raises(EngineStateError, match="this thread has an unfinished generation"):
        localspec.complete(engine, B, max_tokens=4)
    assert first.run().text == alone_a  # untouched: it goes on to its own end
    assert localspec.complete(engine, B, max_tokens=4).finish_reason in ("length", "stop")
    cancelled = engine.generate(A, plain)
    next(cancelled)
    cancelled.cancel()  # what the message advises
    assert localspec.complete(engine, B, max_tokens=4).finish_reason in ("length", "stop")


def test_options_of_a_wrong_type_are_refused_by_name(engine):
    with pytest.raises(InvalidOptionError) as caught:
        engine.generate(A, {"max_tokens": 2})  # type: ignore[arg-type]
    assert caught.value.param == "opts" and "GenerateOptions" in str(caught.value)
    for kw, param in (({"max_tokens": "4"}, "max_tokens"), ({"stop": 3}, "stop"), ({"max_token": 4}, "max_token")):
        with pytest.raises(InvalidOptionError) as caught:
            localspec.complete(engine, A, **kw)
        assert caught.value.param == param, str(caught.value)
    with pytest.raises(InvalidOptionError, match="did you mean max_tokens"):
        localspec.complete(engine, A, max_token=4)
    assert localspec.complete(engine, A, max_tokens=3, stop=None).finish_reason in ("length", "stop")
    # Nothing above took the engine.
    assert localspec.complete(engine, B, max_tokens=3).finish_reason in ("length", "stop")


def test_load_takes_model_free_drafters_by_name_as_the_cli_does(smollm2_path, tmp_path):
    """Issue 41: load(draft="ngram") said "unknown model"."""
    eng = localspec.load(smollm2_path, draft="ngram", n_ctx=256, n_gpu_layers=0, n_threads=1)
    try:
        assert eng.drafter_names() == ["ngram"]
        done = localspec.complete(eng, "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,", max_tokens=12, draft_len=3)
        assert done.stats.drafted > 0
    finally:
        eng.close()
    eng = localspec.load(smollm2_path, draft="off", n_ctx=256, n_gpu_layers=0, n_threads=1)
    try:
        assert eng.drafter_names() == []
    finally:
        eng.close()
    with pytest.raises(LocalspecError, match="is a folder, not a store"):
        localspec.load(smollm2_path, draft=f"rest:{tmp_path}", n_ctx=256, n_gpu_layers=0)
    with pytest.raises(InvalidOptionError, match="draft is empty"):
        localspec.load(smollm2_path, draft="", n_ctx=256, n_gpu_layers=0)


def test_a_drafter_the_engine_lacks_and_messages_that_are_no_list_are_refused(engine):
    """Found trying the API carelessly (issue 41): GenerateOptions(drafter="ngram") on an engine loaded without
    drafters decoded plainly without a word; chat_tokens("hello") ended in Python's own ValueError."""
    with pytest.raises(InvalidOptionError, match="unknown drafter 'ngram'; this engine has: none") as caught:
        engine.generate(A, GenerateOptions(max_tokens=2, drafter="ngram")).run()
    assert caught.value.param == "drafter"
    assert engine.generate(A, GenerateOptions(max_tokens=2, drafter="ngram", speculative=False)).run().tokens
    for bad in ("hello", None, {"role": "user", "content": "Hi"}, ["hello"]):
        with pytest.raises(InvalidOptionError) as caught:
            engine.chat_tokens(bad)  # type: ignore[arg-type]
        assert caught.value.param == "messages"
    assert engine.chat_tokens([{"role": "user", "content": "Hi"}])
