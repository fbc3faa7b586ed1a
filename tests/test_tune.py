"""xkernels.tune without a device: the swept buckets and candidates, and the rules a sweep writes."""

from __future__ import annotations

from xkernels import tuning
from xkernels.tune import _buckets, bucket_rules

WHEN = {"dtype": ["bfloat16", "float16"], "k_max": 1024}
SHAPES = [[4096, 1024], [1024, 4096]]
POINTER = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 4}
TMA = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4, "TMA": True,
       "PERSISTENT": True, "EPILOGUE_SUBTILE": True}


def _first(rules: list[dict], key: dict) -> dict | None:
    """The config a table of ``rules`` gives a call with bucket ``key`` (first match)."""
    return next((r["config"] for r in rules if tuning.matches(r["when"], key)), None)


def test_a_tma_winner_gives_a_tma_rule_then_the_pointer_fallback():
    rules = bucket_rules(WHEN, SHAPES, 0.1, (0.08, TMA), (0.125, POINTER))
    assert [r["when"] for r in rules] == [{"variant": "tma", **WHEN}, WHEN]
    assert [r["config"] for r in rules] == [TMA, POINTER]
    assert rules[0]["measured"] == {"shapes": SHAPES, "ms": 0.08, "torch_ms": 0.1, "speedup": 1.25,
                                    "best_ms": 0.08, "pointer_ms": 0.125}
    assert rules[1]["measured"] == {"shapes": SHAPES, "ms": 0.125, "torch_ms": 0.1, "speedup": 0.8,
                                    "best_ms": 0.08, "pointer_ms": 0.125}
    # the matmul plan looks up twice: with variant "tma" (TMA-eligible calls), then without
    key = {"dtype": "bfloat16", "m": 4096, "n": 4096, "k": 1000}
    assert _first(rules, {**key, "variant": "tma"}) == TMA
    assert _first(rules, key) == POINTER
    assert _first(rules, {**key, "k": 2048}) is None  # outside the bucket


def test_a_pointer_winner_gives_one_plain_rule():
    rules = bucket_rules(WHEN, SHAPES, 0.1, (0.125, POINTER), (0.125, POINTER))
    assert [(r["when"], r["config"]) for r in rules] == [(WHEN, POINTER)]
    assert rules[0]["measured"]["ms"] == rules[0]["measured"]["best_ms"] == rules[0]["measured"]["pointer_ms"]
    key = {"dtype": "float16", "m": 4096, "n": 4096, "k": 512}
    assert _first(rules, {**key, "variant": "tma"}) == _first(rules, key) == POINTER  # so no TMA


def test_no_pointer_config_or_none_at_all():
    rules = bucket_rules(WHEN, SHAPES, 0.1, (0.08, TMA), None)
    assert [r["when"] for r in rules] == [{"variant": "tma", **WHEN}] and "pointer_ms" not in rules[0]["measured"]
    assert bucket_rules(WHEN, SHAPES, 0.1, None, None) == []


def test_matmul_buckets_and_tma_candidates():
    for op in ("matmul", "linear"):
        plain = _buckets(op, "meta")
        tma = _buckets(op, "meta", tma=True)
        whens = [w for w, _, _ in tma]
        assert whens == [w for w, _, _ in plain]
        bf16 = [{k: v for k, v in w.items() if k != "dtype"} for w in whens if "bfloat16" in w["dtype"]]
        assert bf16 == [{"m_max": 16}, {"m_max": 64}, {"k_max": 256}, {"k_max": 1024}, {"m_max": 2048}, {}]
        assert not any(c.get("TMA") for _, _, cs in plain for c in cs)
        for (when, _, cands), (_, _, pointer) in zip(tma, plain):
            extra = [c for c in cands if c.get("TMA")]
            assert [c for c in cands if not c.get("TMA")] == pointer  # the pointer candidates stay
            if "float32" in when["dtype"] or when.get("m_max") == 16:
                assert not extra
            elif when.get("m_max") == 64:
                assert 1 <= len(extra) <= 6 and all(c["BLOCK_M"] == 64 for c in extra)
            else:
                assert 12 <= len(extra) <= 16
                assert any(c.get("PERSISTENT") for c in extra) and any(c.get("EPILOGUE_SUBTILE") for c in extra)
                assert len({tuple(sorted(c.items())) for c in extra}) == len(extra)
