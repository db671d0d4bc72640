"""benchmarks/bench_sampling.py: the rows it times are what the engine reads, and it prints every setting."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_sampling as bs  # noqa: E402


def test_the_row_is_a_read_only_view_of_a_writeable_vector_as_context_logits_hands_out() -> None:
    row = bs.read_only_row(1000)
    assert row.dtype == np.float32 and row.shape == (1000,) and not row.flags.writeable
    assert isinstance(row.base, np.ndarray) and row.base.flags.writeable  # argmax's shortcut applies


def test_it_prints_p_q_the_draw_and_the_argmax_for_each_vocabulary_and_setting(capsys) -> None:  # noqa: ANN001
    assert bs.main(["--rounds", "1", "--vocab", "3000,5000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "q/p" in lines[0] and len(lines) == 1 + 2 * 2
    for line, vocab in zip(lines[1:], ("3000", "3000", "5000", "5000")):
        fields = line.split()
        assert fields[0] == vocab
        assert all(float(v) > 0 for v in fields[-5:])  # p, q, q/p, the draw, the argmax
