"""The backend contract on every built-in backend: sync, events, alignment, properties, geometry."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

import xkernels
from helpers import require_interpreter
from xkernels.backends.npu import (
    DATASHEET,
    SOCS,
    grid_for,
    memory_bytes,
    memory_class,
    soc_family,
    soc_toolchain,
    table_keys,
)


def test_host_event_times_in_milliseconds():
    b = xkernels.get_backend("cpu")
    start, end = b.Event(enable_timing=True), b.Event(enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    b.synchronize()
    assert 15 <= start.elapsed_time(end) <= 500


def test_alignment_helpers():
    cuda, npu = xkernels.get_backend("cuda"), xkernels.get_backend("npu")
    assert (cuda.alignment, npu.alignment, npu.alignment_for("cube")) == (16, 32, 512)
    assert cuda.tile_multiple(torch.float16) == 8 and npu.tile_multiple(torch.float32) == 8
    assert npu.tile_multiple(torch.bfloat16, "cube") == 256
    x = torch.empty(64, 64)
    assert cuda.is_aligned(x) and npu.is_aligned(x)
    assert not cuda.is_aligned(x[:, 1:])           # pointer off by 4 bytes
    assert not npu.is_aligned(torch.empty(8, 33))  # row stride 132 bytes
    assert cuda.is_aligned(torch.empty(8, 36))     # row stride 144 bytes
    for b in (cuda, npu):
        assert b.alignment & (b.alignment - 1) == 0


@pytest.mark.parametrize("name", ["cpu", "interpreter", "npu", "cuda"])
def test_allocator_gives_the_asked_layout(name):
    """Hot entries allocate every result through ``Backend.allocator``: uninitialised memory of
    exactly the size, strides and dtype asked, on the device, outside autograd."""
    device = torch.device("cpu")
    alloc = xkernels.get_backend(name).allocator(device)
    for size, stride, dtype in (((3, 4), (4, 1), torch.float16), ((2, 3, 5), (15, 5, 1), torch.bfloat16),
                                ((4, 3), (1, 4), torch.float32), ((0, 7), (7, 1), torch.int64), ((), (), torch.int32)):
        t = alloc(size, stride, dtype)
        assert (tuple(t.shape), t.stride(), t.dtype, t.device) == (size, stride, dtype, device)
        assert not t.requires_grad and t.untyped_storage().nbytes() >= t.numel() * t.element_size()
    a, b = alloc((64,), (1,), torch.float32), alloc((64,), (1,), torch.float32)
    assert a.data_ptr() != b.data_ptr()  # fresh memory each call


def test_properties_mark_provenance():
    p = xkernels.get_backend("cpu").properties()
    assert p.backend == "cpu" and p.compute_units and p.max_programs_per_launch == 1
    q = xkernels.get_backend("interpreter-npu").properties()
    assert q.arch == "Ascend910B3" and (q.compute_units, q.vector_units) == (20, 40)
    assert all(f.source == "datasheet" for f in q.datasheet.values())
    assert "copy_bandwidth" in q.as_dict()


def test_npu_geometry_rules():
    assert grid_for(10, 40) == 10 and grid_for(10**6, 40) == 40 and grid_for(10**6, 10**6) == 65535
    assert soc_family("Ascend910B3") == "Ascend910B"
    assert set(DATASHEET) >= {"Ascend910B2", "Ascend910B3", "Ascend910B4"}
    emu = xkernels.get_backend("interpreter-npu")
    assert emu.programs(1000, "vector") == 40 and emu.programs(1000, "cube") == 20
    assert emu.programs(3, "cube") == 3
    assert xkernels.get_backend("interpreter").programs(1000) == 1000
    assert emu.arch_fallbacks("Ascend910B3") == ["Ascend910B3", "Ascend910B"]


def test_interpreter_npu_soc_from_env(monkeypatch):
    monkeypatch.setenv("XKERNELS_NPU_SOC", "Ascend910B2")
    assert xkernels.get_backend("interpreter-npu").programs(1000, "vector") == 48
    monkeypatch.setenv("XKERNELS_NPU_SOC", "Ascend999")
    with pytest.raises(ValueError, match="XKERNELS_NPU_SOC='Ascend999' has no datasheet entry"):
        xkernels.get_backend("interpreter-npu").programs(1000)


def test_a3_soc_geometry_memory_and_table_keys(monkeypatch):
    """Atlas A3 SoCs: core counts and memory from the compiler's target description (npu_socs.json);
    their tuning lookups fall back to the A2 family's rules."""
    assert soc_family("Ascend910_9392") == "Ascend910_93" and soc_family("Ascend910_9399") == "Ascend910_93"
    assert soc_family("Ascend910B4-1") == "Ascend910B"
    assert table_keys("Ascend910_9362") == ["Ascend910_9362", "Ascend910_93", "Ascend910B"]
    assert table_keys("Ascend910B1") == ["Ascend910B1", "Ascend910B"]
    for soc in SOCS:
        if soc_toolchain(soc) == "a5":
            continue
        assert memory_bytes(soc) == {"unified_buffer_bytes": 192 * 1024, "l0c_bytes": 128 * 1024}
        assert "compiler" in DATASHEET[soc]["cube_cores"].note or "bishengir" in DATASHEET[soc]["cube_cores"].note
    monkeypatch.setenv("XKERNELS_NPU_SOC", "Ascend910_9392")
    emu = xkernels.get_backend("interpreter-npu")
    assert (emu.programs(1000, "cube"), emu.programs(1000, "vector")) == (24, 48)
    assert emu.arch_fallbacks(emu.arch()) == ["Ascend910_9392", "Ascend910_93", "Ascend910B"]
    x, b = torch.randn(64, 32), torch.randn(32)
    with xkernels.use_backend("interpreter-npu"):
        assert "broadcast.json [Ascend910B] rule" in str(xkernels.ops.broadcast.explain(x, b))


def test_a5_socs_geometry_memory_and_table_keys(monkeypatch):
    """Ascend 950 (A5) targets of bishengir-compile-a5: their own family and rules (``Ascend950``,
    no fallback to the A2 rules sized for a smaller UB), memory and core counts from
    bishengir-opt-a5's target description; the interpreter emulates their geometry."""
    a5 = [s for s in SOCS if SOCS[s]["family"] == "Ascend950"]
    assert len(a5) == 47 and {"Ascend910_9599", "Ascend950PR_9599", "Ascend950DT_95A2", "Ascend950PR_950z"} <= set(a5)
    for soc in a5:
        assert soc_toolchain(soc) == "a5" and SOCS[soc]["arch"] == "dav-c310"
        assert memory_bytes(soc) == {"unified_buffer_bytes": 248 * 1024, "l0c_bytes": 256 * 1024}
        assert table_keys(soc) == [soc, "Ascend950"]
        assert memory_class(soc) == memory_class("Ascend950PR_9599")  # core counts differ, sizes do not
    assert {(SOCS[s]["cube_cores"], SOCS[s]["vector_cores"]) for s in a5} == {(4, 8), (8, 16), (28, 56), (32, 64),
                                                                              (36, 72)}
    assert soc_family("Ascend950PR_9999") == "Ascend950" and soc_toolchain("Ascend910_9599") == "a5"
    assert soc_toolchain("Ascend910B3") == soc_toolchain("Ascend910_9392") == "a2a3"
    assert memory_class("Ascend910B1") == memory_class("Ascend910_9362") != memory_class("Ascend910_9599")
    monkeypatch.setenv("XKERNELS_NPU_SOC", "Ascend950PR_9599")
    emu = xkernels.get_backend("interpreter-npu")
    assert (emu.programs(1000, "cube"), emu.programs(1000, "vector")) == (36, 72)
    assert emu.arch_fallbacks(emu.arch()) == ["Ascend950PR_9599", "Ascend950"]
    require_interpreter("interpreter-npu")  # the rest runs kernels with an A5's geometry
    x, b = torch.randn(64, 32), torch.randn(32)
    w = torch.randn(16, 32)
    with xkernels.use_backend("interpreter-npu"):
        shown = str(xkernels.ops.broadcast.explain(x, b))
        assert "broadcast.json [Ascend950] rule 5" in shown
        torch.testing.assert_close(xkernels.ops.broadcast(x, b), x + b)
        assert "linear.json [Ascend950] rule" in str(xkernels.ops.linear.explain(x, w, activation="gelu"))
        torch.testing.assert_close(xkernels.ops.linear(x, w, activation="gelu"),
                                   torch.nn.functional.gelu(x.double() @ w.double().T).float(), rtol=1e-4, atol=1e-4)


def test_import_survives_a_broken_torch_npu(tmp_path):
    """A torch_npu that raises at import (as without CANN) must not break import xkernels."""
    pkg = tmp_path / "torch_npu"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libhccl.so: cannot open shared object file')\n")
    code = ("import xkernels; b = xkernels.get_backend('npu'); "
            "assert not b.is_available(); print(b.unavailable_reason())")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "libhccl.so" in res.stdout


def test_interpreter_casts_fp32_to_bf16_to_nearest_even():
    """Triton's interpreter casts fp32 to bf16 by truncation; the interpreter backends make it round
    to nearest even as a GPU does: every value, ties, infinities, the largest finite values
    (which round to inf) and NaN, bit for bit as torch's ``.to(torch.bfloat16)``."""
    from helpers import require_interpreter

    require_interpreter()
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as ti

    from xkernels.backends import interpreter

    interpreter._nearest_bf16_casts()
    torch.manual_seed(0)
    x = torch.cat([torch.randn(4096) * 10.0 ** torch.randint(-30, 30, (4096,)),
                   torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), 3.3895e38, -3.3895e38,
                                 float("inf"), -float("inf"), 0.0, -0.0, 1e-40])])
    got = ti.InterpreterBuilder().cast_impl(ti.TensorHandle(x.numpy(), tl.float32), tl.bfloat16)
    want = x.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert got.data.dtype == np.uint16
    assert (got.data == want).all(), np.flatnonzero(got.data != want)[:8]
    nan = ti.InterpreterBuilder().cast_impl(ti.TensorHandle(np.array([float("nan")], np.float32), tl.float32),
                                            tl.bfloat16)
    assert torch.tensor(nan.data.view(np.int16)).view(torch.bfloat16).isnan().all()
