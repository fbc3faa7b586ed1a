"""``python -m xkernels.bench --model`` / ``--model-config``: tiny transformers models of each family,
the four ways, the three modes, the rows (JSON and CSV) and the arguments."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
import torch

from helpers import require_transformers
from xkernels.cli import bench, bench_models
from xkernels.harness import model_zoo
from xkernels.mask_decisions import FUSION as MASKS

pytestmark = pytest.mark.uses_interpreter

ROW_FIELDS = {"model", "class", "layers", "mode", "way", "pass", "batch", "seq", "tokens", "dtype", "device", "backend",
              "torch", "triton", "transformers", "wall_ms", "wall_p20_ms", "wall_p80_ms", "device_ms", "device_p20_ms",
              "device_p80_ms", "torch_wall_ms", "torch_device_ms", "speedup", "device_speedup", "tokens_per_s",
              "rounds", "wall_round_ms", "device_round_ms", "setup_s", "max_abs_dev", "host_ms", "host_p20_ms",
              "host_p80_ms", "torch_host_ms", "host_speedup", "host_round_ms"}
#: float32 models of 2 layers, hidden 64: every way computes torch's function up to rounding
TOL = 1e-4


def _bench(tmp_path, *argv: str) -> tuple[int, list[dict], str]:
    path = tmp_path / "rows.json"
    rc = bench.main([*argv, "--json", str(path)])
    return rc, json.loads(path.read_text())["rows"] if path.exists() else [], str(path)


def _check_timed(rows: list[dict], tokens: int) -> None:
    for r in rows:
        assert ROW_FIELDS <= set(r), ROW_FIELDS - set(r)
        assert r["torch"] == torch.__version__ and r["transformers"] and r["triton"]
        assert r["tokens"] == tokens and r["tokens_per_s"] == tokens / (r["wall_ms"] * 1e-3)
        assert 0 < r["wall_p20_ms"] <= r["wall_ms"] <= r["wall_p80_ms"]
        assert 0 < r["device_p20_ms"] <= r["device_ms"] <= r["device_p80_ms"]
        assert 0 < r["host_p20_ms"] <= r["host_ms"] <= r["host_p80_ms"]
        assert r["max_abs_dev"] < TOL and r.get("grad_rel_dev", 0.0) < TOL, r
        assert ("grad_rel_dev" in r) == (r["pass"] == "forward+backward")
        if r["way"] == "torch":
            assert r["max_abs_dev"] == 0 and r["speedup"] == 1 and r["device_speedup"] == 1 and r["host_speedup"] == 1


def test_tiny_llama_patched_on_the_interpreter(tmp_path, capsys):
    """The Llama family through the Triton kernels: patch() fuses gate_proj + SiLU in each layer
    and the patched model computes torch's logits and gradients."""
    require_transformers()
    rc, rows, _ = _bench(tmp_path, "--model", "llama", "--config", "tiny", "--backend", "interpreter", "--batch", "1",
                         "--seq", "8", "--way", "patch")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert [(r["mode"], r["way"], r["pass"]) for r in rows] == [
        ("eager", w, p) for w in ("torch", "patch") for p in ("forward", "forward+backward")]
    _check_timed(rows, tokens=8)
    assert all(r["class"] == "LlamaForCausalLM" and r["layers"] == 2 and r["backend"] == "interpreter" for r in rows)
    for r in rows[2:]:  # q, k, v, o, gate (+ silu), up, down per layer, and the LM head
        assert (r["patch_replaced"], r["patch_fused"], r["patch_left"]) == (11, 0, 0)  # q, k, v, o, down x 2 + lm_head
        assert r["fusions"] == {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5,
                                "rotary embedding": 2, "linear": 11, MASKS: 1}
        assert r["rounds"] == r["wall_steps"] == 1 and r["wall_round_ms"] == [r["wall_ms"]]  # tiny: one round
    assert "gated mlp 2" in out and "llama            eager     patch        forward " in out


def test_the_run_waits_for_the_native_extension_and_records_it(tmp_path, capsys, monkeypatch):
    """Timing starts once the native extension's build is settled (a fresh process builds it in
    the background): the first model is asked for only after the wait, and the header and the
    printed line say what ran."""
    require_transformers()
    from xkernels.backends import native

    order: list[str] = []
    real_module, real_run = native.module, bench_models.run
    monkeypatch.setattr(native, "module", lambda wait=False: order.append(f"native wait={wait}") or real_module(wait))
    monkeypatch.setattr(bench_models, "run", lambda *a, **k: order.append("model") or real_run(*a, **k))
    rc, rows, path = _bench(tmp_path, "--model", "vit", "--config", "tiny", "--way", "torch", "--rounds", "1")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert order[0] == "native wait=True" and "model" in order and rows
    head = json.loads(open(path).read())["header"]
    assert head["native"] == native.status() and head["native"] in out
    assert f"native extension {native.status()}" in out


def test_every_way_and_both_outputs_on_cpu(tmp_path, capsys):
    require_transformers()
    csv_path = tmp_path / "rows.csv"
    rc, rows, _ = _bench(tmp_path, "--model", "gpt2", "--config", "tiny", "--backend", "cpu", "--batch", "1",
                         "--seq", "4", "--csv", str(csv_path))
    assert rc == 0, capsys.readouterr().out
    assert [(r["way"], r["pass"]) for r in rows] == [
        (w, p) for w in bench_models.WAYS for p in ("forward", "forward+backward")]
    _check_timed(rows, tokens=4)
    assert all(("routed" in r) == r["way"].endswith("enable") for r in rows)
    assert all(r["fusions"] == {"residual add + norm (GPT-2 block)": 2, "linear + activation": 2, "linear": 6,
                                MASKS: 1} for r in rows if r["way"].startswith("patch"))
    with open(csv_path, newline="") as f:
        lines = list(csv.DictReader(f))
    assert [(x["way"], x["pass"]) for x in lines] == [(r["way"], r["pass"]) for r in rows]
    assert float(lines[0]["wall_ms"]) == rows[0]["wall_ms"] and json.loads(lines[-1]["fusions"]) == rows[-1]["fusions"]


def _write(tmp_path, name: str, config: dict) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_model_config_files_qwen2_and_vit(tmp_path, capsys):
    """Any config.json: the class from architectures, --layers over the file's 4 layers, the inputs
    of its kind (token ids; images of the config's size)."""
    require_transformers()
    qwen2 = _write(tmp_path, "qwen2.json", {
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
        "max_position_embeddings": 128, "layer_types": ["full_attention"] * 4, "attention_dropout": 0.1})
    rc, rows, _ = _bench(tmp_path, "--model-config", qwen2, "--layers", "2", "--backend", "cpu", "--batch", "1",
                         "--seq", "8", "--way", "patch", "--fast")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert len(rows) == 4 and all(r["model"] == "Qwen2ForCausalLM" and r["layers"] == 2 for r in rows)
    _check_timed(rows, tokens=8)
    assert rows[-1]["fusions"] == {"residual add + norm (pre-norm decoder layer)": 2, "gated mlp": 2, "rms norm": 5,
                                   "rotary embedding": 2, "linear": 11,  # Qwen2: q, k, v, o, down x 2 + lm_head
                                   MASKS: 1}
    assert "Qwen2ForCausalLM (architectures[0] Qwen2ForCausalLM; 2 layers, hidden 64" in out
    vit = _write(tmp_path, "vit.json", {
        "model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 128, "image_size": 32, "patch_size": 8, "num_channels": 3})
    rc, rows, _ = _bench(tmp_path, "--model-config", vit, "--backend", "cpu", "--batch", "2", "--way", "patch", "--fast")
    assert rc == 0, capsys.readouterr().out
    assert all(r["class"] == "ViTModel" and r["seq"] is None for r in rows)
    _check_timed(rows, tokens=2 * 16)  # 2 images of (32 / 8)^2 patches
    assert rows[-1]["fusions"] == {"residual add + norm (ViT layer)": 2, "feed-forward (training)": 2,
                                   "attention mask by rows": 2, "linear + activation": 2, "linear": 11, MASKS: 1}


def test_several_model_configs_run_in_one_process_and_one_that_cannot_be_built_is_its_own_error_row(
        tmp_path, capsys):
    """--model-config repeated and comma-separated: each file is a model of the run, in order; a
    file transformers cannot build gives an error row naming it, the others still run, exit 1."""
    require_transformers()
    vit = _write(tmp_path, "vit.json", {
        "model_type": "vit", "architectures": ["ViTModel"], "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "intermediate_size": 64, "image_size": 16, "patch_size": 8, "num_channels": 3})
    bert = _write(tmp_path, "bert.json", {"model_type": "bert", "hidden_size": 32, "num_hidden_layers": 1,
                                          "num_attention_heads": 2, "intermediate_size": 64, "vocab_size": 64})
    bad = _write(tmp_path, "bad.json", {"model_type": "no-such-model-type"})
    rc, rows, _ = _bench(tmp_path, "--model-config", f"{vit},{bad}", "--model-config", bert, "--backend", "cpu",
                         "--batch", "1", "--seq", "4", "--way", "torch", "--fast")
    out = capsys.readouterr().out
    assert rc == 1, out
    assert [(r["model"], r["pass"]) for r in rows] == [
        ("ViTModel", "forward"), ("ViTModel", "forward+backward"), ("no-such-model-type", "-"),
        ("bert", "forward"), ("bert", "forward+backward")]
    assert rows[0]["seq"] is None  # --seq is for the text model of the run
    assert rows[2]["error"] == f"--model-config {bad}: transformers {rows[0]['transformers']} knows no model_type " \
                               "'no-such-model-type'" and "ERROR --model-config" in out


def test_cudagraph_on_cpu_is_skipped_with_its_reason(tmp_path, capsys):
    require_transformers()
    rc, rows, _ = _bench(tmp_path, "--model", "bert-base", "--config", "tiny", "--backend", "cpu", "--batch", "1",
                         "--seq", "4", "--way", "torch", "--mode", "cudagraph,eager")
    out = capsys.readouterr().out
    assert rc == 0, out
    skipped = [r for r in rows if "skipped" in r]
    assert [(r["mode"], r["model"]) for r in skipped] == [("cudagraph", "bert-base")]
    assert skipped[0]["skipped"].startswith("CUDA graphs need a cuda device (torch.cuda.CUDAGraph); this run is on cpu")
    assert "cudagraph -            -                skipped: CUDA graphs need a cuda device" in out
    assert [(r["mode"], r["way"]) for r in rows if "skipped" not in r] == [("eager", "torch")] * 2


def test_model_all_runs_every_model(tmp_path, capsys):
    require_transformers()
    rc, rows, _ = _bench(tmp_path, "--model", "all", "--config", "tiny", "--backend", "cpu", "--batch", "1",
                         "--seq", "4", "--way", "torch", "--fast")
    out = capsys.readouterr().out
    assert rc == 0, out
    assert list(dict.fromkeys(r["model"] for r in rows)) == model_zoo.model_names() == ["bert-base", "gpt2", "llama",
                                                                                      "vit"]
    assert {r["model"]: r["tokens"] for r in rows} == {"bert-base": 4, "gpt2": 4, "llama": 4, "vit": 16}
    assert "--seq 4 applies to text models only" in out  # one --seq for several models: vit keeps its patches


@pytest.mark.slow
def test_compile_mode_on_cpu(tmp_path, capsys):
    """torch.compile of the model and of the patched model (xkernels' linear one opaque node)."""
    require_transformers()
    rc, rows, _ = _bench(tmp_path, "--model", "bert-base", "--config", "tiny", "--backend", "cpu", "--batch", "1",
                         "--seq", "4", "--way", "patch", "--mode", "compile")
    assert rc == 0, capsys.readouterr().out
    assert [(r["mode"], r["way"]) for r in rows] == [("compile", w) for w in ("torch", "torch", "patch", "patch")]
    _check_timed(rows, tokens=4)
    assert all(r["setup_s"] > 0 for r in rows)
    assert rows[-1]["fusions"] == {"residual add + norm (output block)": 4, "feed-forward (training)": 2,
                                   "residual add + norm (post-norm)": 1, "attention mask by rows": 2,
                                   "linear + activation": 2, "linear": 11, MASKS: 1}


def _way_state(model):
    import xkernels

    patched = any(isinstance(m, xkernels.nn.Linear | xkernels.nn.Conv1D) for m in model.modules())
    return ("patch" if patched else "torch") + ("+enable" if xkernels.routing._selected else "")


def test_rounds_interleave_the_ways_on_one_model(monkeypatch):
    """Each round times every way's device and host time with the model in that way's state
    (patch applied and undone around it), the order reversed every other round; wall time comes
    from per-step rounds (``_alternating_walls``); medians and p20/p80 over the rounds, speedups
    the medians of per-round ratios."""
    require_transformers()
    from xkernels.harness import resolve_target

    seen = []

    def fake_time(runner, target, settings):
        seen.append(_way_state(runner.model))
        return {p: (1.0, 2.0 * len(seen)) for p in ("forward", "forward+backward")}

    def fake_walls(ways, runners, models, kept, target, rounds):
        assert rounds == 3  # a tiny model: one step round per round (else STEP_ROUNDS_PER_ROUND)
        return {(w, p): [float(i + 1 + 10 * ways.index(w)) for i in range(rounds)]
                for w in ways for p in ("forward", "forward+backward")}

    monkeypatch.setattr(bench_models, "_time", fake_time)
    monkeypatch.setattr(bench_models, "_alternating_walls", fake_walls)
    rows = bench_models.run(bench_models.zoo_spec("gpt2", "tiny"), torch.float32, resolve_target(backend="cpu"), 1, 4,
                            rounds=3, ways=("torch", "patch", "enable"), log=lambda s: None)
    assert seen == ["torch", "patch", "torch+enable", "torch+enable", "patch", "torch", "torch", "patch",
                    "torch+enable"]
    fwd = next(r for r in rows if r["way"] == "patch" and r["pass"] == "forward")
    n = 3
    assert fwd["wall_round_ms"] == [11.0 + i for i in range(n)] and fwd["wall_steps"] == n
    assert fwd["wall_ms"] == statistics.median(11.0 + i for i in range(n))
    assert fwd["speedup"] == pytest.approx(statistics.median((1.0 + i) / (11.0 + i) for i in range(n)))
    assert fwd["host_round_ms"] == [4.0, 10.0, 16.0] and fwd["device_speedup"] == 1.0
    assert fwd["host_speedup"] == sorted([1 / 2, 6 / 5, 7 / 8])[1]


def test_under_compile_each_way_runs_on_its_own_copy_patched_once(monkeypatch):
    """A user compiles a model patched once: in compile mode the patched ways get their own copy of
    the model, patched before anything runs and undone at the end, never switched; the torch way
    keeps the model itself, unpatched. (Eager and CUDA-graph modes switch one model.)"""
    require_transformers()
    import xkernels
    from xkernels.harness import resolve_target

    seen, patches = [], []
    real_patch = xkernels.patch

    def counting_patch(model, *a, **k):
        patches.append(id(model))
        return real_patch(model, *a, **k)

    def fake_runner(mode, model, inputs, target, masks="eager"):
        from xkernels.harness.model_runs import Runner
        return Runner(model, inputs)

    def fake_time(runner, target, settings):
        seen.append((id(runner.model), _way_state(runner.model)))
        return {p: (1.0, 1.0) for p in ("forward", "forward+backward")}

    monkeypatch.setattr(xkernels, "patch", counting_patch)
    monkeypatch.setattr(bench_models, "make_runner", fake_runner)
    monkeypatch.setattr(bench_models, "unavailable_reason", lambda mode, target: None)
    monkeypatch.setattr(bench_models, "_time", fake_time)
    built = []
    real_build = bench_models.model_zoo.build
    monkeypatch.setattr(bench_models.model_zoo, "build", lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    rows = bench_models.run(bench_models.zoo_spec("gpt2", "tiny"), torch.float32, resolve_target(backend="cpu"), 1, 4,
                            modes=("compile",), rounds=2, ways=("torch", "patch"), log=lambda s: None)
    model = built[0].model
    assert [r["way"] for r in rows] == ["torch", "torch", "patch", "patch"] and "error" not in rows[0]
    assert len(patches) == 1 and patches[0] != id(model)  # one copy, patched once
    copy_id = patches[0]
    assert seen == [(id(model), "torch"), (copy_id, "patch"), (copy_id, "patch"), (id(model), "torch")]
    assert _way_state(model) == "torch"
    assert rows[-1]["fusions"] == {"residual add + norm (GPT-2 block)": 2, "linear + activation": 2, "linear": 6,
                                   MASKS: 1}


def test_masks_as_traced_reach_the_captured_and_compiled_runners_and_their_rows(monkeypatch):
    """``--masks traced``: the compile (and cudagraph) runners leave transformers' mask decisions
    to the trace, the rows of those modes say so; eager rows have no such column."""
    require_transformers()
    from xkernels.harness import resolve_target
    from xkernels.harness.model_runs import Runner

    got = []

    def fake_runner(mode, model, inputs, target, masks="eager"):
        got.append((mode, masks))
        return Runner(model, inputs)

    monkeypatch.setattr(bench_models, "make_runner", fake_runner)
    monkeypatch.setattr(bench_models, "unavailable_reason", lambda mode, target: None)
    monkeypatch.setattr(bench_models, "_time", lambda *a: {p: (1.0, 1.0) for p in ("forward", "forward+backward")})
    rows = bench_models.run(bench_models.zoo_spec("gpt2", "tiny"), torch.float32, resolve_target(backend="cpu"), 1, 4,
                            modes=("eager", "compile"), rounds=1, ways=("torch",), log=lambda s: None, masks="traced")
    assert got == [("eager", "eager"), ("compile", "traced")]
    assert [(r["mode"], r.get("masks")) for r in rows] == [("eager", None)] * 2 + [("compile", "traced")] * 2
    assert "(masks as traced)" in bench_models.format_row(rows[-1])
    assert "masks" not in bench_models.format_row(rows[0])
    with pytest.raises(ValueError, match=r"--masks must be among \['eager', 'traced'\], got 'dense'"):
        bench_models.run(bench_models.zoo_spec("gpt2", "tiny"), torch.float32, resolve_target(backend="cpu"), 1, 4,
                         modes=("compile",), masks="dense", log=lambda s: None)


def test_mask_decisions_are_eager_ones_or_none():
    """``masks="eager"`` swaps transformers' tracing answers for the call; ``"traced"`` leaves them."""
    require_transformers()
    import transformers.masking_utils as mu

    from xkernels.harness import model_runs

    own = mu.is_tracing
    with model_runs.mask_decisions("eager", {}):
        assert mu.is_tracing is not own and mu.is_tracing() is False
    assert mu.is_tracing is own
    with model_runs.mask_decisions("traced", {}):
        assert mu.is_tracing is own
    with pytest.raises(ValueError, match="masks must be among"):
        model_runs.mask_decisions("dense", {})
    with pytest.raises(ValueError, match="masks must be among"):
        model_runs.make_runner("compile", torch.nn.Linear(2, 2), {}, None, masks="dense")


def test_alternating_walls_switch_way_every_step():
    """Per round and pass: a warm-up and a timed step of each way in that way's state, the ways
    switching every step, their order reversed every other round."""
    require_transformers()
    from xkernels.harness import model_zoo, resolve_target

    target = resolve_target(backend="cpu")
    built = model_zoo.build(model_zoo.zoo_config("gpt2", "tiny"), "--model gpt2", torch.float32, target.device, 1, 4,
                            zoo_name="gpt2", size="tiny")
    seen = []

    class Runner:
        model = built.model

        def forward(self):
            seen.append(("forward", _way_state(built.model)))

        def train_step(self):
            seen.append(("forward+backward", _way_state(built.model)))

    ways = ["torch", "patch"]
    walls = bench_models._alternating_walls(ways, {w: Runner() for w in ways}, dict.fromkeys(ways, built.model), {},
                                            target, 2)
    assert set(walls) == {(w, p) for w in ways for p in ("forward", "forward+backward")}
    assert all(len(v) == 2 and all(t >= 0 for t in v) for v in walls.values())
    steps = [(p, w) for r in range(2) for p in ("forward", "forward+backward")
             for w in (ways if r % 2 == 0 else ways[::-1]) for _ in range(2)]
    assert seen == steps


def test_a_way_failing_while_timed_is_an_error_row(monkeypatch):
    require_transformers()
    import xkernels
    from xkernels.harness import resolve_target

    def failing_time(runner, target, settings):
        if any(isinstance(m, xkernels.nn.Linear) for m in runner.model.modules()):
            raise RuntimeError("replay failed\nsecond line")
        return {p: (1.0, 1.0, 1.0) for p in ("forward", "forward+backward")}

    monkeypatch.setattr(bench_models, "_time", failing_time)
    rows = bench_models.run(bench_models.zoo_spec("llama", "tiny"), torch.float32, resolve_target(backend="cpu"), 1, 4,
                            ways=("torch", "patch"), log=lambda s: None)
    assert [(r["mode"], r["way"], r["error"]) for r in rows] == [
        ("eager", "patch", "while timed: RuntimeError: replay failed")]


@pytest.mark.parametrize("argv, message", [
    (["--model", "bert-base", "--config", "tiny", "--seq", "65"], "--seq 65 exceeds the model's 64 usable positions"),
    (["--model", "gpt2", "--config", "tiny", "--dtype", "fp16,fp32"], "--model takes one --dtype"),
    (["--model", "gpt2", "--config", "tiny", "--rounds", "0"], "--rounds must be positive, got 0"),
    (["--model", "gpt2", "--mode", "graph"], "--mode must be among ['eager', 'cudagraph', 'compile'], got ['graph']"),
    (["--model", "gpt2", "--way", "fused"], "--way must be among ['torch', 'enable', 'patch', 'patch+enable']"),
    (["--model", "llama2"], "--model must be one of ['bert-base', 'gpt2', 'llama', 'vit'] or 'all', got 'llama2'"),
    (["--model", "gpt2", "--op", "add"], "--op picks op cases: with --model it needs --size models"),
    (["--model-config", "c.json", "--size", "small"], "--model-config benches a whole model, every op: it takes no"),
    (["--model-config", "c.json", "--config", "tiny"], "--config picks a built-in model's size"),
    (["--model-config", "/nonexistent/c.json"], "--model-config /nonexistent/c.json: cannot read it"),
    (["--model", "vit", "--config", "tiny", "--seq", "8"], "--seq does not apply to ViTModel"),
    (["--op", "add", "--layers", "2"], "--layers applies to a whole-model bench"),
    (["--op", "add", "--masks", "traced"], "--masks applies to a whole-model bench"),
    (["--model", "gpt2", "--config", "tiny", "--masks", "traced"], "--masks traced applies to the cudagraph and compile"),
])
def test_bad_model_arguments_exit_2(argv, message, capsys):
    require_transformers()
    assert bench.main([*argv, "--backend", "cpu"]) == 2
    assert message in capsys.readouterr().err


def test_grad_deviation_reports_missing_gradients():
    want = {"a": torch.tensor([1.0, -4.0]), "b": torch.tensor([1e-19])}
    assert bench_models._grad_deviation({"a": torch.tensor([1.5, -4.0]), "b": torch.tensor([-1e-19])}, want) == 0.125
    with pytest.raises(RuntimeError, match=r"no gradient reached 1 parameters \(e.g. a\)"):
        bench_models._grad_deviation({"a": None, "b": torch.tensor([0.0])}, want)


def test_interleaved_device_ms_alternates_and_summarises(monkeypatch):
    """The probes' A/B timer: each round times every runner, in alternating order, and each
    runner's rounds become (median, min, max) of the pass asked for."""
    order, times = [], {"a": iter([3.0, 1.0, 2.0]), "b": iter([5.0, 4.0, 9.0])}

    def fake_time(runner, target, settings):
        order.append(runner)
        return {"forward": (0.0, 0.0), "forward+backward": (next(times[runner]), 0.0)}

    monkeypatch.setattr(bench_models, "_time", fake_time)
    out = bench_models.interleaved_device_ms({"a": "a", "b": "b"}, None, 3)
    assert order == ["a", "b", "b", "a", "a", "b"]
    assert out == {"a": (2.0, 1.0, 3.0), "b": (5.0, 4.0, 9.0)}
