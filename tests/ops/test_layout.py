"""Layout arithmetic: dim collapsing decides which kernel variant and strides a call gets."""

from xkernels.ops.layout import collapse, contiguous_strides, max_offset, next_pow2


def test_contiguous_operands_collapse_to_one_dim():
    shape = (2, 3, 4)
    st = contiguous_strides(shape)
    assert st == (12, 4, 1)
    assert collapse(shape, [st, st]) == ([24], [[1], [1]])


def test_bias_row_keeps_two_dims_and_zero_row_stride():
    sizes, (xs, bs) = collapse((8, 16), [(16, 1), (0, 1)])
    assert sizes == [8, 16] and xs == [16, 1] and bs == [0, 1]


def test_mask_over_heads_merges_broadcast_dims():
    # [B,1,1,S] expanded over [B,H,S,S]: H and the row dim merge (both stride 0 for the mask)
    B, H, S = 2, 3, 5
    sizes, (xs, ms) = collapse((B, H, S, S), [contiguous_strides((B, H, S, S)), (S, 0, 0, 1)])
    assert sizes == [B, H * S, S] and ms == [S, 0, 1] and xs == [H * S * S, S, 1]


def test_size_one_dims_drop_and_scalars():
    assert collapse((1, 1), [(1, 1)]) == ([1], [[1]])
    assert collapse((), [(), ()]) == ([1], [[1], [1]])


def test_offsets_and_pow2():
    assert max_offset([4, 5], [5, 1]) == 19
    assert [next_pow2(n) for n in (1, 2, 3, 1000, 1024)] == [1, 2, 4, 1024, 1024]
