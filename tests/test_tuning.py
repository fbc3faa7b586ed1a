"""Tuning tables (``xkernels/tuning.py``): rule matching (``_min`` / ``_max`` bounds, lists,
equality), first match in directory and arch-key order, configs forced by ``tuning.force``, and
malformed tables refused with their path. A backend of this file's own reads tables planted in a
temporary directory, so no shipped table takes part."""

from __future__ import annotations

import json
import threading

import pytest

import xkernels
from xkernels import tuning
from xkernels.tuning import forced_config, forced_key, lookup, matches

OP = "tuning_test_op"  # no shipped table has this name
DEFAULT = {"BLOCK": 64, "num_warps": 4}


class _Backend(xkernels.Backend):
    name = "tuning-test"
    device_type = "cpu"

    def arch_fallbacks(self, arch: str) -> list[str]:
        return [arch, arch.rstrip("ab")]  # "sm90a" falls back to "sm90", as Ascend910B3 to Ascend910B


BACKEND = _Backend()


@pytest.fixture
def plant(tmp_path, monkeypatch):
    """Write tables for this file's backend and register their directories, in the order given
    (earlier directories are searched first); the user's autotune cache is a fresh empty one."""
    monkeypatch.setenv("XKERNELS_CACHE_DIR", str(tmp_path / "cache"))
    plugins = []

    def write(*tables: dict, name: str = OP) -> list:
        dirs = []
        for i, archs in enumerate(tables):
            d = tmp_path / f"dir{len(plugins)}-{i}"
            d.mkdir()
            (d / f"{name}.json").write_text(json.dumps({"op": name, "backend": BACKEND.name, "source": "test",
                                                        "archs": archs}))
            dirs.append(d)

        class Dirs:
            @xkernels.hookimpl
            def xkernels_add_tuning_dirs(self):
                return [xkernels.TuningDir(backend=BACKEND.name, path=d) for d in dirs]

        plugin = Dirs()
        xkernels.registry.register(plugin)
        plugins.append(plugin)
        return dirs

    yield write
    for p in plugins:
        xkernels.registry.unregister(p)


def test_matches_bounds_lists_and_equality():
    key = {"dtype": "float16", "m": 512, "k": 4096, "bias": True}
    assert matches({}, key)
    assert matches({"m_min": 512, "m_max": 512}, key)  # both bounds inclusive
    assert not matches({"m_min": 513}, key) and not matches({"m_max": 511}, key)
    assert matches({"dtype": ["bfloat16", "float16"]}, key) and not matches({"dtype": ["float32"]}, key)
    assert matches({"bias": True, "k_min": 1024}, key) and not matches({"bias": False, "k_min": 1024}, key)
    assert not matches({"dtype": "float16", "k_max": 2048}, key)  # every condition must hold
    # a bound on a field the key lacks compares with 0; an equality on one compares with None
    assert matches({"n_max": 0}, key) and not matches({"n_min": 1}, key)
    assert not matches({"variant": "tiled"}, key)


def test_first_matching_rule_wins_and_merges_over_the_default(plant):
    (d,) = plant({"sm90": [{"when": {"m_max": 64}, "config": {"BLOCK": 16}},
                           {"when": {"dtype": ["float16", "bfloat16"]}, "config": {"BLOCK": 128, "measured_by": "a"},
                            "measured": {"date": "2026-01-01"}},
                           {"when": {}, "config": {"BLOCK": 32}}]})
    small = lookup(OP, BACKEND, "sm90", {"m": 64, "dtype": "float16"}, DEFAULT)
    assert small.config == {"BLOCK": 16, "num_warps": 4} and "rule 0" in small.source and not small.measured
    assert str(d) in small.source and small.when == {"m_max": 64}
    half = lookup(OP, BACKEND, "sm90", {"m": 65, "dtype": "bfloat16"}, DEFAULT)
    assert half.config == {"BLOCK": 128, "num_warps": 4, "measured_by": "a"} and "rule 1" in half.source
    assert half.measured and half.record == {"date": "2026-01-01"}
    other = lookup(OP, BACKEND, "sm90", {"m": 65, "dtype": "float32"}, DEFAULT)
    assert other.config["BLOCK"] == 32 and "rule 2" in other.source
    assert DEFAULT == {"BLOCK": 64, "num_warps": 4}  # the op default is not changed by a merge


def test_arch_keys_then_default_then_the_builtin_default(plant):
    plant({"sm90a": [{"when": {"m_min": 1000}, "config": {"BLOCK": 1}}],
           "sm90": [{"when": {"m_min": 100}, "config": {"BLOCK": 2}}],
           "default": [{"when": {"m_min": 10}, "config": {"BLOCK": 3}}]})
    blocks = {m: lookup(OP, BACKEND, "sm90a", {"m": m}, DEFAULT).config["BLOCK"] for m in (1000, 100, 10, 1)}
    assert blocks == {1000: 1, 100: 2, 10: 3, 1: DEFAULT["BLOCK"]}
    miss = lookup(OP, BACKEND, "sm90a", {"m": 1}, DEFAULT)
    assert miss.source == f"built-in default of op {OP!r} (no table rule matched)" and miss.config == DEFAULT
    assert miss.config is not DEFAULT
    assert lookup(OP, BACKEND, "sm90a", {"m": 1}, DEFAULT, rules_only=True) is None
    # another arch reads only its own key and "default"
    assert lookup(OP, BACKEND, "sm80", {"m": 1000}, DEFAULT).config["BLOCK"] == 3


def test_an_earlier_directory_wins_over_a_later_one_even_with_a_specific_arch(plant):
    first, second = plant({"default": [{"when": {"m_min": 8}, "config": {"BLOCK": 8}}]},
                          {"sm90": [{"when": {}, "config": {"BLOCK": 99}}]})
    hit = lookup(OP, BACKEND, "sm90", {"m": 8}, DEFAULT)
    assert hit.config["BLOCK"] == 8 and str(first) in hit.source
    fallthrough = lookup(OP, BACKEND, "sm90", {"m": 7}, DEFAULT)
    assert fallthrough.config["BLOCK"] == 99 and str(second) in fallthrough.source


def test_force_overrides_every_table_and_nests(plant):
    plant({"sm90": [{"when": {}, "config": {"BLOCK": 16}}]})
    assert forced_config() is None and forced_key() is None
    config = {"num_warps": 8, "BLOCK": 256}
    with tuning.force(config):
        config["BLOCK"] = 1  # the block keeps its own copy
        got = lookup(OP, BACKEND, "sm90", {"m": 1}, DEFAULT)
        assert got.config == {"BLOCK": 256, "num_warps": 8} and got.source == "forced by xkernels.tuning.force()"
        assert forced_key() == (("BLOCK", 256), ("num_warps", 8))  # sorted: one key per config
        hash(forced_key())
        forced_config()["BLOCK"] = 2  # a copy: the forced config is not changed through it
        assert forced_config() == {"num_warps": 8, "BLOCK": 256}
        with tuning.force({"BLOCK": 32}):
            assert lookup(OP, BACKEND, "sm90", {"m": 1}, DEFAULT).config == {"BLOCK": 32, "num_warps": 4}
            assert forced_key() == (("BLOCK", 32),)
        assert forced_key() == (("BLOCK", 256), ("num_warps", 8))
    assert forced_key() is None
    assert lookup(OP, BACKEND, "sm90", {"m": 1}, DEFAULT).config["BLOCK"] == 16


def test_force_is_per_thread():
    seen = {}
    barrier = threading.Barrier(2)

    def other():
        barrier.wait()
        seen["other"] = forced_key()
        barrier.wait()

    t = threading.Thread(target=other)
    t.start()
    with tuning.force({"BLOCK": 4}):
        barrier.wait()
        barrier.wait()
        seen["here"] = forced_key()
    t.join()
    assert seen == {"other": None, "here": (("BLOCK", 4),)}


@pytest.mark.parametrize("body, message", [
    ({"op": OP, "rules": []}, "has no 'archs' mapping"),
    ({"op": OP, "archs": {"sm90": [{"when": {}, "config": {"BLOCK": 1}}, {"when": {}}]}},
     r"archs\['sm90'\]\[1\] has no 'config' object"),
    ({"op": OP, "archs": {"default": [{"when": {}, "config": [16]}]}}, r"archs\['default'\]\[0\] has no 'config'"),
])
def test_a_malformed_table_is_refused_naming_its_path(plant, body, message):
    (d,) = plant({"default": []})
    path = d / f"{OP}.json"
    path.write_text(json.dumps(body))
    with pytest.raises(ValueError, match=message) as err:
        lookup(OP, BACKEND, "sm90", {"m": 1}, DEFAULT)
    assert str(path) in str(err.value)


def test_an_edited_table_is_read_again(plant):
    """Tables are cached by modification time: an edit is seen by the next lookup."""
    import os

    (d,) = plant({"default": [{"when": {}, "config": {"BLOCK": 1}}]})
    assert lookup(OP, BACKEND, "sm90", {}, DEFAULT).config["BLOCK"] == 1
    path = d / f"{OP}.json"
    path.write_text(json.dumps({"op": OP, "archs": {"default": [{"when": {}, "config": {"BLOCK": 2}}]}}))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert lookup(OP, BACKEND, "sm90", {}, DEFAULT).config["BLOCK"] == 2


def test_candidates_come_from_the_first_section_with_a_matching_group(plant):
    (d,) = plant({"default": []})
    table = {"op": OP, "archs": {"default": []},
             "candidates": {"sm90": [{"when": {"dtype": "float32"}, "configs": [{"BLOCK": 1}]}],
                            "default": [{"when": {}, "configs": [{"BLOCK": 2}, {"BLOCK": 3, "cost": [1.0]}]},
                                        {"when": {"m_min": 10}, "configs": [{"BLOCK": 4}]}]}}
    (d / f"{OP}.json").write_text(json.dumps(table))
    got, source = tuning.candidates(OP, BACKEND, "sm90", {"dtype": "float16", "m": 20})
    assert got == [{"BLOCK": 2}, {"BLOCK": 3, "cost": [1.0]}, {"BLOCK": 4}] and "[default] candidates" in source
    got, source = tuning.candidates(OP, BACKEND, "sm90", {"dtype": "float32", "m": 20})
    assert got == [{"BLOCK": 1}] and "[sm90] candidates" in source
    assert tuning.candidates("no_such_op_table", BACKEND, "sm90", {}) == ([], "")
