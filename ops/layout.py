"""Layout arithmetic shared by the ops' host code: collapsing dims, strides, sizes."""

from __future__ import annotations

from typing import Any

INT32_MAX = 2**31 - 1


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def collapse(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Merge adjacent dims where every operand's strides allow it; drop size-1 dims."""
    dims = [(s, [st[i] for st in strides]) for i, s in enumerate(shape) if s != 1]
    if not dims:
        return [1], [[1] for _ in strides]
    out_sizes = [dims[0][0]]
    out_strides = [list(dims[0][1])]
    for size, sts in dims[1:]:
        prev = out_strides[-1]
        if all(p == s * size for p, s in zip(prev, sts)):
            out_sizes[-1] *= size
            out_strides[-1] = list(sts)
        else:
            out_sizes.append(size)
            out_strides.append(list(sts))
    return out_sizes, [list(col) for col in zip(*out_strides)]


def max_offset(sizes: list[int], strides: list[int]) -> int:
    return sum((s - 1) * abs(st) for s, st in zip(sizes, strides))


def prod(xs: Any) -> int:
    p = 1
    for v in xs:
        p *= int(v)
    return p


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))
