"""A tiny kernel the interpreter backend runs once to check that it can run the ops' kernels."""

import triton
import triton.language as tl


@triton.jit
def loop_probe(out_ptr, n):
    for i in range(0, n):
        tl.store(out_ptr + i, i)
