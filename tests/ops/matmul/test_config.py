"""Which config a matmul/linear call runs, and why (ops/matmul/config.py): the wave count, the
split-K conditions, the cost fit, and the order rule -> fitted candidates -> device properties."""

from __future__ import annotations

import json
import random

import pytest
import torch

from xkernels import tuning
from xkernels.backend import DeviceProperties, Figure
from xkernels.backends.cuda import DATASHEET, CudaBackend
from xkernels.cli import matmul_tables
from xkernels.ops.matmul import config as mc

SMS = 132
CPU = torch.device("cpu")


class _Sm(CudaBackend):
    """The cuda backend's selection for a given arch, no device needed."""

    def __init__(self, arch: str = "sm90", tma: bool = True) -> None:
        super().__init__()
        self._arch, self._tma = arch, tma

    def arch(self, device=None) -> str:
        return self._arch

    def compute_units(self, device=None) -> int:
        return SMS

    def tensor_descriptors(self, device=None) -> bool:
        return self._tma


def _shape(m: int, n: int, k: int, batch: int = 1) -> mc.Shape:
    return mc.Shape(m, n, k, batch, 2, batch == 1)


def _select(m: int, n: int, k: int, *, arch: str = "sm90", tma: bool = True, op: str = "linear") -> mc.Selection:
    shape = _shape(m, n, k)
    key = mc.bucket_key(torch.bfloat16, shape, None, True)
    return mc.select(op, _Sm(arch, tma), CPU, key, shape, "kmajor" if tma else None)


def test_waves_count_tiles_per_compute_unit():
    # BERT's 768-wide layers at 8192 tokens: 128x256 tiles make 192 tiles, two waves on 132 SMs
    assert mc.waves({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, _shape(8192, 768, 768), SMS) == (192, 2)
    assert mc.waves({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, _shape(8192, 768, 768), SMS) == (384, 3)
    # blocks clamp to the problem: one row is one 16-row tile
    assert mc.waves({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 64}, _shape(1, 768, 768), SMS) == (12, 1)
    assert mc.waves({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, _shape(64, 64, 64, batch=300), SMS) == (300, 3)


@pytest.mark.parametrize("shape,split", [
    (_shape(16, 4096, 4096), 4),  # few rows, long K: split
    (_shape(16, 4096, 4096, batch=2), 1),  # batched: one 2-D product only
    (_shape(16, 4096, 64), 1),  # K shorter than two blocks
    (mc.Shape(16, 4096, 4096, 1, 2, True, max_programs=100), 1),  # 64 tiles x 4 > one launch
])
def test_split_k_only_where_it_applies(shape, split):
    assert mc.split_of({"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": 4}, shape) == split


def test_fit_cost_recovers_the_model_and_drops_a_glitch():
    cfg = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    truth = [2e-6, 3e-3, 5e-3]
    rng = random.Random(0)
    shapes = [_shape(rng.choice([1, 128, 512, 2048, 8192]), rng.choice([768, 3072, 4096]), rng.choice([768, 4096]))
              for _ in range(20)]
    points = [(s, mc.fitted_ms(truth, cfg, s, SMS) * rng.uniform(0.98, 1.02)) for s in shapes]
    points[3] = (points[3][0], points[3][1] * 60)  # one timing glitch
    cost = mc.fit_cost(points, cfg, SMS)
    assert cost is not None
    for s in shapes:
        assert mc.fitted_ms(cost, cfg, s, SMS) == pytest.approx(mc.fitted_ms(truth, cfg, s, SMS), rel=0.1)
    assert mc.fit_cost(points[:2], cfg, SMS) is None


def test_a_measured_shape_takes_its_rule():
    sel = _select(8192, 768, 3072)  # BERT-base FFN down-projection, in the sm90 corpus
    assert sel.measured and "rule" in sel.source and sel.why == "a measured rule for this shape class"


@pytest.mark.parametrize("advantage", [0.01, 100.0], ids=["kernel wins", "BLAS wins"])
def test_an_unmeasured_shape_takes_the_wave_model_over_fitted_candidates(monkeypatch, advantage):
    """No rule: the smallest kernel estimate, which must beat the fitted BLAS estimate by
    ``VENDOR_ADVANTAGE`` (forced here to either side) or the call runs the BLAS."""
    monkeypatch.setattr(mc, "VENDOR_ADVANTAGE", advantage)
    sel = _select(4000, 1536, 1536)  # no model in the corpus has this layer
    assert not sel.measured and "candidates" in sel.source
    assert "wave model" in sel.why and "fitted costs" in sel.why and f"on {SMS} compute units" in sel.why
    blas = sel.estimates_ms.pop("device BLAS")
    assert sel.estimates_ms and min(sel.estimates_ms.values()) > 0 and blas > 0
    if advantage < 1:  # the winner is the smallest kernel estimate (device-bound: host costs less)
        assert sel.estimates_ms[mc._label(sel.config)] == min(sel.estimates_ms.values())
        assert "faster than the device's BLAS (" in sel.why
    else:
        assert sel.config == {"VENDOR": True} and "is not 100x faster than the device's BLAS" in sel.why


def test_a_launch_bound_call_is_decided_by_the_host_cost_of_each_route():
    """Routes compare by wall time per call, the longer of the device estimate and the route's
    host cost (``Backend.route_host_ms``). A tiny layer's kernel (a few us of device time) runs its pointer
    kernel: one launch record, less host time than the BLAS route. Gemma-2B's qkv at 77 tokens
    (H100, 2026-11-23): its TMA kernel ran 12.9 us at 0.88x device time; by wall estimates (its device time
    over either host cost) no kernel is 1.1x faster than the BLAS, which it runs now."""
    tiny = _select(32, 512, 512)
    assert not tiny.config.get("VENDOR") and not tiny.config.get("TMA") and "launch-bound" in tiny.why
    gemma = mc.select("linear", _SmMeasured(), CPU, mc.bucket_key(torch.bfloat16, _shape(77, 2560, 2048), None,
                                                                  False), _shape(77, 2560, 2048), "kmajor")
    assert gemma.config == {"VENDOR": True}
    tma_cfg = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 128, "TMA": True}
    sm, costs = _Sm(), CudaBackend.route_host_ms
    assert mc.host_ms(sm, {"VENDOR": True}) == costs["vendor"] > mc.host_ms(sm, tma_cfg) > mc.host_ms(
        sm, {**tma_cfg, "TMA": False})
    assert mc.host_ms(sm, {**tma_cfg, "TMA": False, "SPLIT_K": 4}, _shape(16, 4096, 4096)) == costs["split"]


def test_a_backend_without_host_costs_decides_by_device_estimates():
    """A backend that gives no ``route_host_ms`` (npu, a plugin's) compares routes by device
    estimates alone: the tiny layer is no longer launch-bound by a host cost."""
    class _NoHost(_Sm):
        route_host_ms = {}  # noqa: RUF012

    assert mc.host_ms(_NoHost(), {"VENDOR": True}) == 0.0
    sel = mc.select("linear", _NoHost(), CPU, mc.bucket_key(torch.bfloat16, _shape(32, 512, 512), None, False),
                    _shape(32, 512, 512), "kmajor")
    assert "launch-bound" not in sel.why


class _SmMeasured(_Sm):
    """With the H100's copy bandwidth as the bench caches it (or only its datasheet)."""

    def __init__(self, copy_gbps: float | None = 3000.0, datasheet: bool = True) -> None:
        super().__init__()
        self.copy_gbps, self.datasheet = copy_gbps, datasheet

    def properties(self, device=None) -> DeviceProperties:
        copy = None if self.copy_gbps is None else Figure(self.copy_gbps, "GB/s", "measured", "test")
        return DeviceProperties(backend="cuda", name="NVIDIA H100 80GB HBM3", arch="sm90", compute_units=SMS,
                                compute_unit_kind="SM", memory_bytes=80 << 30, max_programs_per_launch=2**31 - 1,
                                copy_bandwidth=copy, datasheet=dict(DATASHEET["H100"]) if self.datasheet else {})


def test_no_kernel_estimate_beats_streaming_its_operands():
    """A 1-token GEMM is a stream of its weight. Qwen2.5-7B's o-projection (3584 x 3584, no rule;
    held-out GEMMs, H100, 2026-11-23): the fit alone promised a kernel 1.1x faster than cuBLAS, which ran
    0.83x; with the floor every kernel estimate is at least its operand bytes at the streaming
    rate (plus its fitted fixed cost), and the call runs the BLAS."""
    shape = _shape(1, 3584, 3584)
    key = mc.bucket_key(torch.bfloat16, shape, None, False)
    unknown = _SmMeasured(None, datasheet=False)  # no bandwidth figure: no floor
    fit_only = mc.select("linear", unknown, CPU, key, shape, "kmajor")
    floored = mc.select("linear", _SmMeasured(), CPU, key, shape, "kmajor")
    stream = mc.stream_bytes_per_ms(_SmMeasured(), CPU)
    assert stream == pytest.approx(3000 * 1e6 * CudaBackend.stream_floor[1])
    assert mc.stream_bytes_per_ms(_SmMeasured(None), CPU) == pytest.approx(3350 * mc.COPY_OF_DATASHEET * 1e6
                                                                           * CudaBackend.stream_floor[1])
    assert mc.stream_bytes_per_ms(unknown, CPU) is None
    weight_ms = 3584 * 3584 * 2 / stream
    kernels = {k: v for k, v in floored.estimates_ms.items() if k != "device BLAS"}
    assert kernels and min(kernels.values()) >= weight_ms
    assert min(v for k, v in fit_only.estimates_ms.items() if k != "device BLAS") < min(kernels.values())
    assert not fit_only.config.get("VENDOR") and floored.config == {"VENDOR": True}


def test_fit_vendor_cost_recovers_the_blas_model():
    truth = [0.0009, 0.0003, 0.0004, 0.007]
    rng = random.Random(1)
    points = [(s, act, mc.vendor_ms(truth, s, act) * rng.uniform(0.98, 1.02))
              for s in (_shape(rng.choice([1, 128, 2048, 8192]), rng.choice([768, 3072, 4096]),
                               rng.choice([768, 4096])) for _ in range(24)) for act in (False, True)]
    cost = mc.fit_vendor_cost(points)
    assert cost is not None and all(c >= 0 for c in cost)
    for s, act, _ in points:
        assert mc.vendor_ms(cost, s, act) == pytest.approx(mc.vendor_ms(truth, s, act), rel=0.1)
    assert mc.fit_vendor_cost(points[:3]) is None


def test_a_rule_measured_with_an_activation_says_nothing_of_the_bare_gemm():
    """BERT's FFN up-projection was measured with gelu only: gelu calls take its rule, the
    activation-free call (the pre-activation a training step keeps) does not."""
    shape = _shape(8192, 3072, 768)
    gelu = mc.select("linear", _Sm(), CPU, mc.bucket_key(torch.bfloat16, shape, "gelu", True), shape, "kmajor")
    bare = mc.select("linear", _Sm(), CPU, mc.bucket_key(torch.bfloat16, shape, None, True), shape, "kmajor")
    assert gelu.measured and "rule" in gelu.source
    assert not bare.measured and "candidates" in bare.source


def test_tma_candidates_compete_only_for_tma_calls():
    with_tma, without = _select(1000, 1536, 1536), _select(1000, 1536, 1536, tma=False)
    assert not without.config.get("TMA")
    assert not any("+tma" in label for label in without.estimates_ms)
    assert any("+tma" in label for label in with_tma.estimates_ms)


def test_an_arch_without_a_table_gets_the_device_property_model():
    sel = _select(8192, 768, 3072, arch="sm100")  # no sm100 section in the cuda tables
    assert not sel.measured
    assert "built-in candidates" in sel.source and "'sm100'" in sel.source
    assert "device properties" in sel.why
    assert set(sel.estimates_ms) == {mc._label({**mc.MATMUL_DEFAULT, **c}) for c in mc.BUILTIN_CANDIDATES}


def test_a_forced_config_wins_and_drops_tma_where_the_call_cannot_take_it():
    with tuning.force({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "TMA": True, "PERSISTENT": True}):
        sel = _select(256, 256, 256, tma=False)
    assert sel.source.startswith("forced") and "TMA" not in sel.config and "PERSISTENT" not in sel.config


def _row(op, m, n, k, torch_ms, cfgs, act=None):
    return {"op": op, "M": m, "N": n, "K": k, "act": act, "torch_ms": torch_ms,
            "cfgs": [{"cfg": c, "ms": ms} for c, ms in cfgs]}


A = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}
B = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": True}


def test_tables_merge_runs_by_median_and_keep_ops_apart():
    rows = [_row("linear", 128, 768, 768, 0.010, [(A, 0.012), (B, 0.5)]),  # B glitched
            {"op": "linear", "M": 128, "N": 768, "K": 768, "act": None, "cfgs": [{"cfg": B, "ms": 0.009}] * 2},
            _row("matmul", 128, 768, 768, 0.011, [(A, 0.013)]),
            {"M": 64, "N": 768, "K": 768, "act": None, "torch_ms": 0.01, "cfgs": [{"cfg": A, "ms": 0.02}]}]
    lin = matmul_tables.merge(rows, "linear")
    assert [(r["M"], r["op"]) for r in lin] == [(64, "linear"), (128, "linear")]  # op-less rows count for all
    times = {json.dumps(c["cfg"], sort_keys=True): c["ms"] for c in lin[1]["cfgs"]}
    assert times[json.dumps(B, sort_keys=True)] == 0.009  # median of 0.5, 0.009, 0.009
    mm = matmul_tables.merge(rows, "matmul")
    assert [r["cfgs"][0]["ms"] for r in mm if r["M"] == 128] == [0.013]


def test_tables_rules_pair_tma_with_a_pointer_fallback_and_key_activations_first():
    rows = [_row("linear", 128, 768, 768, 0.010, [(A, 0.012), (B, 0.009)]),
            _row("linear", 128, 768, 768, 0.010, [(A, 0.011), (B, 0.013)], act="gelu"),
            _row("linear", 8192, 768, 768, 0.02, [(A, 0.03), (B, 0.021)])]
    rules = matmul_tables.rules(rows, ["bfloat16"], vendor_margin=0)
    assert rules[0]["when"]["activation"] == "gelu" and rules[0]["config"] == A
    plain = rules[1:]
    assert [r["when"].get("variant") for r in plain] == ["tma", None, "tma", None]
    assert plain[0]["when"]["m_max"] + 1 == plain[2]["when"]["m_min"]  # M classes split at the geometric mean
    assert plain[0]["when"]["m_max"] == 1024 and "m_max" not in plain[2]["when"]
    assert plain[1]["config"] == A and plain[1]["measured"]["worst_ratio"] == round(0.010 / 0.012, 3)


def test_tables_key_a_class_measured_only_with_activations_to_them_and_fit_the_blas():
    rows = [_row("linear", m, 3072, 768, 0.01 * m / 128, [(A, 0.012 * m / 128), (B, 0.009 * m / 128)], act="gelu")
            for m in (128, 1024, 8192)]
    rules = matmul_tables.rules(rows, ["bfloat16"], vendor_margin=0)
    assert rules and all(r["when"]["activation"] == matmul_tables.WITH_ACTIVATION for r in rules)
    assert "none" not in matmul_tables.WITH_ACTIVATION and "gelu" in matmul_tables.WITH_ACTIVATION
    more = rows + [_row("linear", 512, 768, 768, 0.004, [(A, 0.005), (B, 0.004)])]
    configs = matmul_tables.candidates(more, ["bfloat16"], SMS)[0]["configs"]
    vendor = [c for c in configs if c.get("VENDOR")]
    assert len(vendor) == 1 and len(vendor[0]["cost"]) == 4


def test_tables_route_a_class_to_the_vendor_blas_only_when_every_kernel_is_slower():
    rows = [_row("linear", 128, 768, 768, 0.010, [(A, 0.0115), (B, 0.0112)]),  # best kernel 12% slower
            _row("linear", 8192, 768, 768, 0.020, [(A, 0.0204), (B, 0.0203)])]  # within the 3% margin
    rules = matmul_tables.rules(rows, ["bfloat16"])
    assert rules[0]["config"] == {"VENDOR": True} and "variant" not in rules[0]["when"]
    assert rules[0]["measured"]["best_kernel_ratio"] == round(0.010 / 0.0112, 3)
    assert all(not r["config"].get("VENDOR") for r in rules[1:]) and len(rules) == 3
    assert not any(r["config"].get("VENDOR") for r in matmul_tables.rules(rows, ["bfloat16"], vendor_margin=0))


def test_the_streaming_floor_has_a_fixed_part():
    """OPT-1.3B's qkv (2048 -> 6144, bias) at 77 tokens, a shape no rule covers: the fit promised
    16.7 us for 128x64x128 and the kernel ran 22.6 us against cuBLAS's 18.5
    (results/2026-11-23-h100-linear-corpus-bf16). The fastest GEMMs of 1-128 tokens take
    ~7.85 us + bytes / 2.42 TB/s, so no kernel estimate is below the cuda backend's ``stream_floor`` + its bytes
    at the streaming rate, and this call runs the BLAS."""
    shape = _shape(77, 6144, 2048)
    key = mc.bucket_key(torch.bfloat16, shape, None, True)
    sel = mc.select("linear", _SmMeasured(), CPU, key, shape, "kmajor")
    stream = mc.stream_bytes_per_ms(_SmMeasured(), CPU)
    floor = CudaBackend.stream_floor[0] + (77 + 6144) * 2048 * 2 / stream
    kernels = {k: v for k, v in sel.estimates_ms.items() if k != "device BLAS"}
    assert min(kernels.values()) >= floor > 0.017
    assert sel.config == {"VENDOR": True} and "not 1.1x faster than the device's BLAS" in sel.why


def test_the_ridge_of_a_device_without_cached_peaks_comes_from_its_datasheet():
    """An arch with no table and no measured peaks (the properties model): the ridge is the
    datasheet's dense bf16 TFLOP/s over its HBM bandwidth at the copy fraction, not the
    default ratio (the datasheet names are the cuda backend's own: ``bf16_tflops``,
    ``hbm_bandwidth``)."""
    sheet = DATASHEET["H100"]
    expected = sheet["bf16_tflops"].value * 1e12 / (sheet["hbm_bandwidth"].value * mc.COPY_OF_DATASHEET * 1e9)
    assert mc._ridge(_SmMeasured(None), CPU) == pytest.approx(expected)
    assert expected != pytest.approx(mc.DEFAULT_RIDGE_FLOP_PER_BYTE)
    assert mc._ridge(_SmMeasured(None, datasheet=False), CPU) == mc.DEFAULT_RIDGE_FLOP_PER_BYTE


def test_kernels_tied_at_the_streaming_floor_are_ranked_by_their_fit():
    """At 256 x 256 x 256 every candidate's floored estimate is the same (the floor's fixed part
    and the same operand bytes): the fit alone ranks them. Before that tie-break the first
    candidate won, a 128x64x128 tile that ran 9.9 us where the fit's pick ran 6.6 (H100, 2026-11-23)."""
    shape = _shape(256, 256, 256)
    key = mc.bucket_key(torch.bfloat16, shape, "gelu", True)
    backend = _SmMeasured()
    sel = mc.select("linear", backend, CPU, key, shape, "kmajor")
    kernels = {k: v for k, v in sel.estimates_ms.items() if k != "device BLAS"}
    floor = min(kernels.values())
    tied = {k for k, v in kernels.items() if v - floor < 1e-12}
    assert len(tied) > 5  # most candidates sit at the floor here
    cands, _ = tuning.candidates("linear", backend, "sm90", key)
    fits = {mc._label({k: v for k, v in c.items() if k != "cost"}): mc.fitted_ms(c["cost"], c, shape, SMS)
            for c in cands if "cost" in c and not c.get("VENDOR")}
    chosen = mc._label(sel.config)
    assert chosen in tied and fits[chosen] == min(fits[k] for k in tied)
