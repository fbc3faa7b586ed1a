"""Launch records (backends/cuda_launch.py): the packing checked against what Triton compiles,
the C record's refusals checked without a GPU; on a GPU, the ops' hot path runs through records."""

from __future__ import annotations

import re
import struct

import pytest
import torch

from xkernels.backends import cuda_launch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402


@triton.jit
def _probe_kernel(x_ptr, y_ptr, out_ptr, n, alpha, big, flag, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x_ptr + offs, mask=m) + alpha * tl.load(y_ptr + offs, mask=m)
    if flag:
        v = v + big
    tl.store(out_ptr + offs, v, mask=m)


SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "alpha": "fp32",
             "big": "i64", "flag": "i1", "BLOCK": "constexpr"}
VALUES = (None, None, None, 1000, 0.5, 2**40, True, 256)


def test_slots_pack_each_type_little_endian_and_append_the_scratch_pointers():
    slots, ptr_slots, _ = cuda_launch.pack_slots(SIGNATURE, VALUES, 3)
    assert ptr_slots == (0, 1, 2)
    cells = [slots[i:i + 8] for i in range(0, len(slots), 8)]
    assert len(cells) == 7 + 2  # 7 runtime parameters (BLOCK is compiled in) + global/profile scratch
    assert cells[3] == struct.pack("<i", 1000).ljust(8, b"\0")
    assert cells[4] == struct.pack("<f", 0.5).ljust(8, b"\0")
    assert cells[5] == struct.pack("<q", 2**40)
    assert cells[6] == b"\x01".ljust(8, b"\0")
    assert cells[0] == cells[7] == cells[8] == bytes(8)


def test_bf16_is_the_top_half_of_fp32_and_fp16_is_ieee_half():
    assert cuda_launch.pack_slot("bf16", 1.5)[:2] == struct.pack("<f", 1.5)[2:]
    assert cuda_launch.pack_slot("fp16", 1.5)[:2] == struct.pack("<e", 1.5)


def test_a_fixed_tensor_packs_its_pointer():
    """A tensor at a pointer position that is not one of the call's (a plan's filler for absent
    operands) is fixed: its data pointer is packed; the call's own stay placeholders."""
    import torch

    fixed = torch.empty(4)
    slots, ptr_slots, _ = cuda_launch.pack_slots(SIGNATURE, (None, fixed, None, *VALUES[3:]), (0, 2))
    assert ptr_slots == (0, 2)
    assert slots[8:16] == struct.pack("<Q", fixed.data_ptr())
    assert slots[0:8] == slots[16:24] == bytes(8)


def test_unpackable_signatures_are_refused():
    assert cuda_launch.pack_slots({"d": "tensordesc<bf16[64, 64]>", "n": "i32"}, (None, 1), 0) is None
    assert cuda_launch.pack_slots({"p": "i32", "q": "*fp32"}, (1, None), 1) is None  # 1st must be a pointer
    assert cuda_launch.pack_slots({"p": "*fp32"}, (None, 1), 1) is None  # length mismatch


def test_slot_count_matches_the_compiled_kernel_parameters():
    """The record passes one slot per kernel parameter: count them in what Triton compiles for sm90."""
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip(f"this Triton ({triton.__version__}) has no NVIDIA compiler backend")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {"BLOCK": 256}
    compiled = triton.compile(ASTSource(_probe_kernel, SIGNATURE, consts), target=GPUTarget("cuda", 90, 32))
    entry = re.search(r"\.entry\s+\w+\((.*?)\)", compiled.asm["ptx"], re.S)
    params = re.findall(r"\.param\s+\.(\w+)", entry.group(1))
    slots, _, _ = cuda_launch.pack_slots(dict(compiled.src.signature), VALUES, 3)
    assert len(slots) // 8 == len(params), params
    assert params[:3] == ["u64"] * 3 and params[-2:] == ["u64", "u64"]


_TMA_CONSTS = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, GROUP_M=8, HAS_BIAS=True, ACT=0, B_KMAJOR=True,
                  PERSISTENT=False, EPILOGUE_SUBTILE=False, A_MMAJOR=False, WARP_SPECIALIZE=False)
#: linear's TMA kernel at Gemma-2B's qkv (77 tokens, 2048 -> 2560, bias): A (M, K), B the (N, K) weight, C (M, N)
_TMA_DESCS = {0: cuda_launch.Descriptor((77, 2048), (2048, 1)), 1: cuda_launch.Descriptor((2560, 2048), (2048, 1)),
              2: cuda_launch.Descriptor((77, 2560), (2560, 1))}


def _tma_packed():
    """(PTX parameter list, Packed) of the TMA kernel compiled for sm90."""
    from triton.backends import backends
    if "nvidia" not in backends:
        pytest.skip(f"this Triton ({triton.__version__}) has no NVIDIA compiler backend")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from xkernels.ops.matmul.kernels import matmul_tma_kernel

    sig = {"a_desc": "tensordesc<bf16[64, 128]>", "b_desc": "tensordesc<bf16[64, 128]>",
           "c_desc": "tensordesc<bf16[64, 64]>", "bias_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
           "slope": "fp32", **{k: "constexpr" for k in _TMA_CONSTS}}
    compiled = triton.compile(ASTSource(matmul_tma_kernel, sig, _TMA_CONSTS), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, "num_stages": 4})
    entry = re.search(r"\.entry\s+\w+\((.*?)\)", compiled.asm["ptx"], re.S)
    params = re.findall(r"\.param\s+([^,\n]*)", entry.group(1))
    values = (None, None, None, None, 77, 2560, 2048, 0.01, *_TMA_CONSTS.values())
    packed = cuda_launch.pack_slots(dict(compiled.src.signature), values, (0, 1, 2, 3), _TMA_DESCS,
                                      list(compiled.metadata.tensordesc_meta))
    return params, packed, compiled.metadata.tensordesc_meta


def test_tensor_descriptor_kernels_pack_a_map_per_descriptor():
    """Each descriptor is a 128-byte tensor-map parameter, then its shape (i32) and strides (i64),
    as Triton 3.6 lowers it: slot for slot what the compiled sm90 kernel takes, the maps at its
    64-byte-aligned 128-byte parameters, encoded from Triton's own per-descriptor metadata."""
    params, packed, meta = _tma_packed()
    assert packed is not None and len(packed.slots) // 8 == len(params), params
    map_params = [i for i, p in enumerate(params) if "[128]" in p]
    assert [m[0] for m in packed.maps] == map_params == [0, 5, 10]
    assert packed.ptr_slots == (-1, -2, -3, 15)  # three map bases, then the bias pointer's slot
    cells = [packed.slots[8 * i:8 * i + 8] for i in range(len(params))]
    assert [struct.unpack("<i", c[:4])[0] for c in cells[1:3]] == [77, 2048]  # A's shape, then strides
    assert [struct.unpack("<q", c)[0] for c in cells[3:5]] == [2048, 1]
    for (_, dtype, swizzle, elem_size, shape, strides, block, padding), m, d in zip(
            packed.maps, meta, _TMA_DESCS.values()):
        assert (swizzle, elem_size, block, padding) == (m["swizzle"], 2, tuple(m["block_size"]), 0)
        assert (shape, strides) == (d.shape, d.strides) and dtype == cuda_launch._TMA_DTYPE_TO_DRIVER[m["elem_type"]]
    # a descriptor with no description, or passed as a fixed value, is not packable
    assert cuda_launch.pack_slots({"d": "tensordesc<bf16[64, 64]>", "n": "i32"}, (None, 1), (0,), {}, meta) is None


def test_a_record_with_tensor_maps_refuses_before_the_driver():
    _, packed, _ = _tma_packed()
    mod = cuda_launch.module()
    if mod is None:
        pytest.skip(f"launch records cannot be built here: {cuda_launch.unavailable_reason()}")
    if mod.driver_ok():
        pytest.skip("an NVIDIA driver is present: the refusal test would launch a fake function")
    rec = mod.Record(0x1234, 20, 1, 1, 128, 0, packed.slots, packed.ptr_slots, lambda: 0, lambda d: 0, _Chain(),
                     _Chain(), packed.maps)
    assert rec.map(0) == bytes(128)  # nothing encoded yet
    assert rec(256, 512, 1024 + 8, 2048) is False  # C's base misaligned: no map is encoded
    with pytest.raises(RuntimeError, match="libcuda"):
        rec(256, 512, 1024, 2048)
    assert rec.map(2) == bytes(128)
    with pytest.raises(IndexError):
        rec.map(3)
    bad = ((99, *packed.maps[0][1:]),)
    with pytest.raises(ValueError, match="tensor map"):
        mod.Record(0x1234, 1, 1, 1, 128, 0, packed.slots, (-1,), int, int, _Chain(), _Chain(), bad)
    with pytest.raises(ValueError, match="out of range"):  # a map number that does not exist
        mod.Record(0x1234, 1, 1, 1, 128, 0, packed.slots, (-2,), int, int, _Chain(), _Chain(), packed.maps[:1])


class _Chain:
    def __init__(self, calls=()):
        self.calls = list(calls)


def _record(enter=(), leave=()):
    mod = cuda_launch.module()
    if mod is None:
        pytest.skip(f"launch records cannot be built here: {cuda_launch.unavailable_reason()}")
    if mod.driver_ok():
        pytest.skip("an NVIDIA driver is present: the refusal tests would launch a fake function")
    slots, ptr_slots, _ = cuda_launch.pack_slots(SIGNATURE, VALUES, 3)
    return mod.Record(0x1234, 4, 1, 1, 128, 0, slots, ptr_slots, lambda: 0, lambda d: 0,
                      _Chain(enter), _Chain(leave))


def test_record_refuses_misaligned_pointers_and_installed_hooks_before_the_driver():
    rec = _record()
    assert rec(256, 512, 1024 + 8) is False  # not 16-byte aligned
    assert _record(enter=[print])(256, 512, 1024) is False
    assert _record(leave=[print])(256, 512, 1024) is False
    with pytest.raises(RuntimeError, match="libcuda"):  # aligned, no hooks: it would launch
        rec(256, 512, 1024)
    cells = rec.slots()
    assert struct.unpack("<Q", cells[16:24])[0] == 0  # a refused call writes no pointer
    with pytest.raises(TypeError, match="3 tensors"):
        rec(256, 512)


def test_record_takes_data_pointers_from_tensors():
    rec = _record()
    t = torch.empty(64)
    assert rec(t, t, t[1:]) is False  # t[1:] starts 4 bytes in


def test_is_record_names_records_only():
    rec = _record()
    assert cuda_launch.is_record(rec)
    assert not cuda_launch.is_record(lambda *tensors: True) and not cuda_launch.is_record(None)


def test_bad_records_are_value_errors():
    mod = cuda_launch.module()
    if mod is None:
        pytest.skip(cuda_launch.unavailable_reason())
    with pytest.raises(ValueError, match="slots"):
        mod.Record(1, 1, 1, 1, 32, 0, b"1234567", (0,), int, int, _Chain(), _Chain())
    with pytest.raises(ValueError, match="out of range"):
        mod.Record(1, 1, 1, 1, 32, 0, bytes(16), (5,), int, int, _Chain(), _Chain())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_hot_calls_on_cuda_launch_through_a_record(monkeypatch, request):
    import xkernels
    from xkernels.ops import add, broadcast, matmul

    # matmul's kernel route, as a measured rule gives it (a 48x32x80 call is launch-bound: on cuda
    # the selection sends it to the BLAS without a 1.1x measured margin)
    monkeypatch.setattr(xkernels.get_backend("cuda"), "kernel_needs_evidence", False, raising=False)
    matmul._forget()
    request.addfinalizer(matmul._forget)  # no route made here outlives the test

    def closure_kinds(fn):  # what an entry's closures hold, through wrapping entries
        kinds = set()
        for c in getattr(fn, "__closure__", None) or ():
            kinds.add(type(c.cell_contents).__name__)
            if callable(c.cell_contents) and getattr(c.cell_contents, "__closure__", None):
                kinds |= closure_kinds(c.cell_contents)
        return kinds

    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    m, b = torch.randn(64, 96, device="cuda"), torch.randn(96, device="cuda")
    a2, b2 = torch.randn(48, 32, device="cuda"), torch.randn(32, 80, device="cuda")
    for op, args, ref in [(add, (x, y), torch.add), (broadcast, (m, b), torch.add), (matmul, (a2, b2), torch.matmul)]:
        op(*args)
        hot = op.hot_entry(*args)
        assert hot is not None
        kinds = closure_kinds(hot)
        assert "Record" in kinds, (op.name, kinds)
        for _ in range(3):  # fresh data through the same entry
            for t in args:
                t.copy_(torch.randn_like(t))
            torch.testing.assert_close(op(*args), ref(*args), rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_keyword_and_scalar_forms_on_cuda_repeat_with_fresh_values():
    """The forms whose hot entries pick a launch per call (out= by data pointers, alpha and a
    scalar operand by value): fresh data and values through the same entries."""
    from xkernels.ops import add, broadcast

    m, b = torch.randn(64, 96, device="cuda"), torch.randn(96, device="cuda")
    o = torch.full_like(m, float("nan"))
    for i in range(4):
        for t in (m, b):
            t.copy_(torch.randn_like(t))
        alpha, s = (2.5, -1.0, 3.0, 2.5)[i], (0.5, 7.0, -0.0, 0.5)[i]
        assert broadcast(m, b, out=o) is o
        torch.testing.assert_close(o, m + b)
        assert add(m, b, alpha=alpha, out=o) is o
        torch.testing.assert_close(o, torch.add(m, b, alpha=alpha))
        torch.testing.assert_close(add(m, m, alpha=alpha), torch.add(m, m, alpha=alpha))
        torch.testing.assert_close(add(m, s), m + s)
        assert broadcast.hot_entry(m, b, out=o) is not None and add.hot_entry(m, m, alpha=alpha) is not None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tma_hot_calls_on_cuda_encode_their_tensor_maps_per_call():
    """linear's TMA plan (BERT's 768 -> 768 at 128 tokens: a TMA rule on sm90) repeats through a
    record that encodes A's, B's and C's tensor maps from each call's own tensors: fresh
    allocations (other base pointers) give the right results, call after call, 2-D and 3-D x."""
    import torch.nn.functional as F

    from xkernels.ops import linear

    w, b = torch.randn(768, 768, device="cuda", dtype=torch.bfloat16), torch.randn(768, device="cuda",
                                                                                   dtype=torch.bfloat16)
    for shape in [(128, 768), (2, 64, 768)]:
        x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
        if not linear.explain(x, w, b).config.get("TMA"):
            pytest.skip(f"no TMA plan for this shape on {torch.cuda.get_device_name()}")
        linear(x, w, b)
        hot = linear.hot_entry(x, w, b)
        records = [c.cell_contents for c in hot.__closure__ if cuda_launch.is_record(c.cell_contents)]
        assert records, "the TMA entry has no launch record"
        for _ in range(3):
            x, w2, b2 = torch.randn_like(x), torch.randn_like(w), torch.randn_like(b)  # new base pointers
            got = linear(x, w2, b2)
            torch.testing.assert_close(got.float(), F.linear(x.float(), w2.float(), b2.float()), rtol=2e-2, atol=2e-1)
        assert records[0].map(0) != bytes(128)  # A's tensor map was encoded by the record


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_replayable_records_an_op_call_and_refuses_a_synchronising_one():
    """``Backend.replayable`` on cuda: a CUDA graph of the call (its replay rewrites the recorded
    output with the inputs' current values); a call that synchronises is refused (None) before
    any capture, one that fails only while captured (another stream's work) is refused too, and
    the process stays usable: random ops (whose generator a failed capture can leave in capture
    mode) and ordinary calls still run."""
    import xkernels

    backend = xkernels.get_backend("cuda")
    x = torch.randn(64, 64, device="cuda")
    outs = []
    replay = backend.replayable(lambda: outs.append(xkernels.ops.add(x, 1.0)))
    assert replay is not None
    x.fill_(2.0)
    replay()
    torch.cuda.synchronize()
    assert torch.equal(outs[-1], torch.full_like(x, 3.0))
    assert backend.replayable(lambda: (x + 1).sum().item()) is None
    other = torch.cuda.Stream()
    event = torch.cuda.Event()

    def waits_on_an_uncaptured_event():
        with torch.cuda.stream(other):
            event.record()
        torch.cuda.current_stream().wait_event(event)  # joins an uncaptured stream: capture fails
        return x + 1

    assert backend.replayable(waits_on_an_uncaptured_event) is None
    assert torch.randn(8, device="cuda").isfinite().all()
    torch.nn.functional.dropout(torch.ones(8, device="cuda"), 0.5, training=True)
    assert torch.equal(xkernels.ops.add(x, 1.0), torch.full_like(x, 3.0))
