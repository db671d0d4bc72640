"""The rows a draft context hands back are the rows asked for, on real llama.cpp.

llama.cpp copies the first ``n_outputs`` rows of a graph's logits and hidden tensors. EAGLE-3's
decoder keeps every row of a batch in them, and GLM-4.5's MTP graph takes its hidden row before
picking the output rows: asked for the last row of a catch-up alone, both handed back the first
row's, so every step's first draft (EAGLE-3) or second (GLM's MTP) came from the wrong position.
Here a catch-up that asks for its last row alone must read what the same batch gives with every
row an output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localspec.backend import Context, Eagle3Context, Model, MtpContext

# Batches of 5 rows, and one of 40 asking for its last: past _MAX_COPIED_ROWS, where EAGLE-3 decodes the
# rows before the output in a pass of their own as an MTP head does.
OUTPUTS = {"last": [False] * 4 + [True], "second-and-last": [False, True, False, False, True],
           "last-of-40": [False] * 39 + [True]}
TEXT = " ".join(["The quick brown fox jumps over the lazy dog"] * 8)


def _eagle3(d: Path) -> tuple[Model, Context, Eagle3Context]:
    import eagle3_model

    target = Model(eagle3_model.write_llama_target(d / "llama-tiny.gguf", mix=0.3))
    ctx = Context(target, n_ctx=256, n_threads=1)
    return target, ctx, Eagle3Context(Model(eagle3_model.write_eagle3_draft(d / "eagle3-tiny.gguf", agree=True)),
                                      ctx, n_threads=1)


def _mtp(writer: str):
    def make(d: Path) -> tuple[Model, Context, MtpContext]:
        import mtp_model

        target = Model(getattr(mtp_model, writer)(d / f"{writer}.gguf"), load_mtp=True)
        ctx = Context(target, n_ctx=256, n_threads=1)
        return target, ctx, MtpContext(ctx, n_threads=1)
    return make


CONTEXTS = {"eagle3": _eagle3, "glm4moe-mtp": _mtp("write_mtp_model"), "step35-mtp": _mtp("write_step35_model")}


@pytest.mark.parametrize("kind", sorted(CONTEXTS))
@pytest.mark.parametrize("outputs", sorted(OUTPUTS))
def test_the_rows_read_back_are_the_rows_asked_for(kind: str, outputs: str, tmp_path: Path) -> None:
    wanted = OUTPUTS[outputs]
    rows = len(wanted)
    target, ctx, head = CONTEXTS[kind](tmp_path)
    try:
        tokens = target.tokenize(TEXT)[:rows]
        assert len(tokens) == rows
        fed = np.random.default_rng(0).standard_normal((rows, head.n_embd)).astype(np.float32)
        head.decode(tokens, range(rows), fed, [True] * rows)
        every = [(np.array(head.logits(i)), np.array(head.hidden(i))) for i in range(rows)]
        assert not np.allclose(every[0][0], every[-1][0])  # rows that differ: a misread row shows
        head.rollback_to(0)
        head.decode(tokens, range(rows), fed, wanted)
        for i in (i for i in range(rows) if wanted[i]):
            np.testing.assert_allclose(head.logits(i), every[i][0], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(head.hidden(i), every[i][1], rtol=1e-4, atol=1e-4)
        assert head.n_past == rows  # the rows before the first output are in the cache all the same
    finally:
        head.close()
        ctx.close()
        target.close()
