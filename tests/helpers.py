"""Helpers for op tests: float64 reference comparison, NaN-poisoned outputs, input guards, planted
tuning tables."""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterable

import pytest
import torch

# max |err| <= atol + rtol * |ref|; low precision compared against a float64 reference.
TOL = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (8e-3, 8e-3),
    torch.float32: (1e-5, 1.3e-6),
    torch.int32: (0, 0),
    torch.int64: (0, 0),
    torch.float64: (1e-12, 1e-12),
}


def dot_scale(k: int) -> float:
    """Tolerance scale for a result summed over ``k`` products: rounding grows like sqrt(k)."""
    return max(1.0, k ** 0.5)


def rand(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=torch.float32).to(dtype).to(device)
    return torch.randint(-1000, 1000, shape, dtype=dtype).to(device)


def poisoned(shape, dtype, device) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.full(shape, -123456789 if dtype == torch.int64 else -12345, dtype=dtype, device=device)


def assert_close(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0):
    """``ref`` is the float64 (or exact int) reference; ``dtype`` picks the tolerance.

    The absolute tolerance is taken relative to the reference's typical magnitude (its RMS, at least
    1): rounding errors scale with the operands, so an element near zero that a sum reached by
    cancelling terms of magnitude 50 (a weight's gradient) carries the terms' error, not its own."""
    dtype = dtype or got.dtype
    assert got.shape == ref.shape, (got.shape, ref.shape)
    assert got.dtype == dtype, (got.dtype, dtype)
    if not dtype.is_floating_point:
        assert torch.equal(got.cpu(), ref.cpu().to(dtype)), "integer result differs"
        return
    g, r = got.detach().cpu().double(), ref.detach().cpu().double()
    assert not torch.isnan(g).any() or torch.isnan(r).any(), "NaN left in output (element not written?)"
    rtol, atol = TOL[dtype]
    finite = r[torch.isfinite(r)]
    magnitude = max(1.0, finite.pow(2).mean().sqrt().item()) if finite.numel() else 1.0
    torch.testing.assert_close(g, r, rtol=rtol * scale, atol=atol * scale * magnitude, equal_nan=True)


class Unchanged:
    """Context manager asserting the given tensors are bit-identical after the block."""

    def __init__(self, *tensors):
        self.tensors = [t for t in tensors if isinstance(t, torch.Tensor)]

    def __enter__(self):
        self.copies = [t.clone() for t in self.tensors]
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            for t, c in zip(self.tensors, self.copies):
                assert torch.equal(t, c), "an input was modified"


@contextlib.contextmanager
def planted_tables(directory, backend: str, tables: dict):
    """Write ``{op: {"archs": ..., "candidates": ...}}`` as tuning tables into ``directory`` and
    register it for ``backend`` the way a plugin adds tables, for the block."""
    import json

    import xkernels

    directory.mkdir(parents=True, exist_ok=True)
    for op, body in tables.items():
        (directory / f"{op}.json").write_text(json.dumps({"op": op, "backend": backend, "source": "planted by a test",
                                                          **body}))

    class Planted:
        @xkernels.hookimpl
        def xkernels_add_tuning_dirs(self):
            return [xkernels.TuningDir(backend=backend, path=directory)]

    plugin = Planted()
    xkernels.registry.register(plugin)
    try:
        yield
    finally:
        xkernels.registry.unregister(plugin)


@contextlib.contextmanager
def every_matmul_to_vendor(monkeypatch):
    """Every matmul/linear selection is ``{"VENDOR": true}`` (a measured class where the device's
    BLAS won) for the block; plans and hot entries are dropped before and after."""
    from xkernels.ops import linear, matmul
    from xkernels.ops.matmul import config as matmul_config

    vendor = matmul_config.Selection({"VENDOR": True}, "a test rule", "measured faster", True)
    monkeypatch.setattr(matmul_config, "select", lambda *a, **k: vendor)
    matmul._forget()
    linear._forget()
    try:
        yield
    finally:
        matmul._forget()
        linear._forget()


def assert_model_close(got: torch.Tensor, torch_result: torch.Tensor, ref64: torch.Tensor,
                       draws: Iterable[tuple[torch.Tensor, torch.Tensor]] = ()) -> None:
    """A whole model's (or a loss curve's) ``got`` against the float64 run ``ref64``: its error
    may be ``MODEL_ERROR_RATIO`` times the error of PyTorch's own run ``torch_result`` in the same
    dtype, taken as at least one rounding (unit roundoff) of the largest |reference| value (where
    PyTorch happens to round its largest values luckily, another summation order cannot be held
    to that luck), plus the dtype's torch.testing atol (xkernels/harness/tolerances.py).

    ``draws``: more ``(PyTorch result, float64 result)`` pairs of the same model, each on the
    inputs ``nudged`` afresh; PyTorch's error is then the largest over all its runs. One run's
    error is one draw of a pseudo-random quantity: where a few elements set the maximum (a small
    tensor, rows that repeat), one draw can fall several times below the usual size, and the
    ratio of two draws is heavy-tailed (two independent normal errors: P(|X| > 4|Y|) =
    1 - (2/pi) atan 4 = 16%), which the one-rounding floor bounds only for shallow results."""
    from xkernels.harness.tolerances import ELEMENTWISE, MODEL_ERROR_RATIO

    assert got.shape == torch_result.shape == ref64.shape, (got.shape, torch_result.shape, ref64.shape)
    assert got.dtype == torch_result.dtype, (got.dtype, torch_result.dtype)
    g, t, r = (v.detach().cpu().double() for v in (got, torch_result, ref64))
    assert not torch.isnan(g).any() or torch.isnan(r).any(), "NaN in the result"
    ratio, atol = MODEL_ERROR_RATIO[0], ELEMENTWISE[got.dtype].atol
    err, torch_err = (g - r).abs().max().item(), (t - r).abs().max().item()
    runs = 1
    for t2, r2 in draws:
        assert t2.shape == ref64.shape and t2.dtype == got.dtype, (t2.shape, t2.dtype)
        torch_err = max(torch_err, (t2.detach().cpu().double() - r2.detach().cpu().double()).abs().max().item())
        runs += 1
    one_rounding = torch.finfo(got.dtype).eps / 2 * r.abs().max().item()
    assert err <= ratio * max(torch_err, one_rounding) + atol, (
        f"max |error| {err:.3e} against float64; PyTorch's own error {torch_err:.3e} (largest of {runs} run(s)), "
        f"one rounding of the largest value {one_rounding:.3e}; allowed {ratio:g} x {max(torch_err, one_rounding):.3e} "
        f"+ atol {atol:.0e}")


def patch_matches_float64(model: torch.nn.Module, x: torch.Tensor):
    """``xkernels.patch(model)`` (returned, the model left patched) after checking that the patched
    model's output and every parameter's gradient (of the output's mean square) are as close to
    the float64 model's as PyTorch's own (``assert_model_close``)."""
    import copy

    import xkernels

    ref = copy.deepcopy(model).double()
    want = model(x)
    want.square().mean().backward()
    want_grads = [p.grad.clone() for p in model.parameters()]
    r = ref(x.double())
    r.square().mean().backward()
    model.zero_grad(set_to_none=True)
    report = xkernels.patch(model)
    got = model(x)
    assert_model_close(got, want, r)
    got.square().mean().backward()
    for g, w, p in zip((p.grad for p in model.parameters()), want_grads, ref.parameters()):
        assert_model_close(g, w, p.grad)
    return report


def nudged(tensors: Iterable[torch.Tensor], rel: float = 2.0**-16) -> list[torch.Tensor]:
    """Detached CPU copies of ``tensors``, each element moved by ``rel`` * N(0, 1) of itself (about
    2**7 float32 ulps): the same problem to that accuracy, with fresh rounding errors all the way
    through, for more draws of PyTorch's own error (``assert_model_close``'s ``draws``)."""
    return [(t.detach().cpu().double() * (1 + rel * torch.randn(t.shape, dtype=torch.float64))).to(t.dtype)
            for t in tensors]


class CheckCounter:
    """Counts calls of ``op.check`` (the full path's first step)."""

    def __init__(self, op, monkeypatch):
        self.n = 0
        real = op.check

        def counted(*args, **kwargs):
            self.n += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(op, "check", counted)


def require_interpreter(name: str = "interpreter") -> None:
    """Skip, naming the reason, where Triton's interpreter cannot run here (e.g. a GPU machine
    whose numpy is newer than its Triton's interpreter supports); CI's pinned set runs it."""
    from xkernels.registry import registry

    reason = registry.backend(name).unavailable_reason()
    if reason is not None:
        pytest.skip(f"backend {name!r} is not available here: {reason}")


def require_transformers(submodule: str = ""):
    """transformers (the ``models`` extra), or a skip naming it; a failure where
    ``XKERNELS_REQUIRE_MODELS=1`` (``tox -e cpu`` installs it, so its absence there is a defect)."""
    name = f"transformers.{submodule}" if submodule else "transformers"
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if os.environ.get("XKERNELS_REQUIRE_MODELS") == "1":
            raise
        pytest.skip(f"{name} is not installed ({e}); pip install 'xkernels[models]'")


def tiny_model(config: str, model: str, kwargs: dict, device) -> tuple[torch.nn.Module, dict]:
    """A transformers model from ``config(**kwargs)`` (eager attention, seed 0) on ``device`` in
    training mode, and token-id inputs for it (``decoder_input_ids`` too for an encoder-decoder);
    a skip where this transformers has no such config."""
    tf = require_transformers()
    if not hasattr(tf, config):
        pytest.skip(f"transformers {tf.__version__} has no {config}")
    cfg = getattr(tf, config)(**kwargs)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    m = getattr(tf, model)(cfg).to(device).train()
    torch.manual_seed(1)
    inputs = {"input_ids": torch.randint(3, 64, (2, 7), device=device)}
    if getattr(cfg, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, 64, (2, 5), device=device)
    return m, inputs


@pytest.fixture(scope="session")
def peaks_dir(tmp_path_factory: pytest.TempPathFactory):
    """A session-wide measured-peaks cache directory (conftests of tests that run the bench)."""
    return tmp_path_factory.mktemp("peaks")


@pytest.fixture(autouse=True)
def private_peaks_cache(peaks_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the measured-peaks cache out of the user's home (autouse where a conftest imports it)."""
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(peaks_dir))


#: the TMA kernels' tile forms the interpreter tests run with the TMA path on (the
#: ``tma_interpreter`` fixture of tests/conftest.py)
TMA_TINY = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 2, "TMA": True}
TMA_FORMS = [TMA_TINY, {**TMA_TINY, "PERSISTENT": True, "EPILOGUE_SUBTILE": True},
             {**TMA_TINY, "PERSISTENT": True, "PROGRAMS_PER_SM": 2, "EPILOGUE_SUBTILE": True}]
TMA_FORM_IDS = ["one tile each", "persistent + subtile", "persistent x2 + subtile"]


def sm90_planning_backend(tensor_descriptors: bool = True):
    """A cuda backend that plans for an sm90 part (132 SMs, no grid limit) with no device needed:
    the object ``dispatch.select`` is made to return where a test checks sm90 table decisions."""
    from xkernels.backends.cuda import CudaBackend

    class Sm90Planning(CudaBackend):
        def arch(self, device=None) -> str:
            return "sm90"

        def compute_units(self, device=None) -> int:
            return 132

        def max_programs(self, unit="vector", device=None) -> int:
            return 2**31 - 1

        def tensor_descriptors(self, device=None) -> bool:
            return tensor_descriptors

    return Sm90Planning()
