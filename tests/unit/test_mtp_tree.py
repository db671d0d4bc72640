"""What each node of a chained MTP heads' tree decodes (``drafting/mtp_tree.py``), on hand-built paths."""

from __future__ import annotations

import pytest

from localspec.drafting.mtp_tree import batch_rows, head_for, level_batches, node_decode

X_LAST, POS0 = 9, 20  # the history's last token and its position


def decode(path, seq=5, parent_seq=3, n_heads=3):  # noqa: ANN001, ANN201
    return node_decode(path, seq, parent_seq, x_last=X_LAST, pos0=POS0, n_heads=n_heads)


def test_a_node_before_the_last_heads_depth_rebuilds_its_draft_region():
    """Depth 2 of 3 heads: head 2 decodes [x_last, t1, t2] at pos0.. over the history alone (sequence 0's
    cells before pos0), fed the target's row, then head 0's output at the root, then head 1's at (t1,)."""
    node = decode((4, 7))
    assert head_for(2, 3) == 2
    assert node.tokens == (X_LAST, 4, 7) and node.positions == (20, 21, 22)
    assert node.share == (0, POS0) and node.seq == 5
    assert node.fed == (None, (), (4,))


def test_a_node_past_the_last_head_is_one_row_over_its_parents_cells():
    """Depth 3 of 3 heads (and any depth of one head): the last head, one row at pos0 + depth on a sequence
    sharing its parent's cells up to there, fed its parent's output."""
    node = decode((4, 7, 1))
    assert head_for(3, 3) == head_for(7, 3) == 2
    assert node.tokens == (1,) and node.positions == (23,) and node.share == (3, 23) and node.fed == ((4, 7),)
    one_head = decode((4,), n_heads=1)
    assert one_head.tokens == (4,) and one_head.positions == (21,) and one_head.share == (3, 21)
    assert one_head.fed == ((),)


def test_a_level_is_one_decode_per_head_within_the_batch():
    """Nodes of depths 1, 2 and 4 (3 heads): a decode for head 1, one for head 2 holding both the depth-2
    region and the depth-4 row; a batch too small for all splits between nodes, never inside one."""
    nodes = [decode((1,), 1), decode((2, 3), 2), decode((1, 5, 6, 8), 3), decode((2,), 4)]
    batches = level_batches(nodes, 3, 64)
    assert [(h, [n.seq for n in b]) for h, b in batches] == [(1, [1, 4]), (2, [2, 3])]
    assert sum(len(n.tokens) for _, b in batches for n in b) == 2 + 3 + 1 + 2  # sum of (d + 1) before the last head
    small = level_batches(nodes, 3, 3)
    assert [(h, [n.seq for n in b]) for h, b in small] == [(1, [1]), (1, [4]), (2, [2]), (2, [3])]
    with pytest.raises(ValueError, match="exceeds n_batch"):
        level_batches(nodes, 3, 2)


def test_a_decodes_outputs_are_its_last_rows_in_node_order():
    """Each node's rows but its last go first, then the last rows, so logits are computed for them only."""
    rows = batch_rows([decode((2, 3), 2), decode((1, 5), 3)])
    assert rows.tokens == [X_LAST, 2, X_LAST, 1, 3, 5]
    assert rows.positions == [20, 21, 20, 21, 22, 22] and rows.seqs == [2, 2, 3, 3, 2, 3]
    assert rows.fed == [None, (), None, (), (2,), (1,)]
    assert rows.outputs == [False] * 4 + [True] * 2 and rows.first_output == 4
    past = batch_rows([decode((1, 5, 6), 4), decode((2, 3, 3, 1), 6)])  # past the last head: one row each
    assert past.tokens == [6, 1] and past.positions == [23, 24] and past.outputs == [True, True]
