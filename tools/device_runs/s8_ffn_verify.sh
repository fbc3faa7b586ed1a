# session 8: the corpus's BERT-base and ViT-B/16 linear GEMMs (bf16, fp16) after the FFN rules' change
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 420 python3 -m xkernels.bench --size models --op linear --model bert-base --model vit-b16 --dtype bfloat16,float16 --json $OUT/bench-models-linear-bert-vit.json > $OUT/bench-models-linear-bert-vit.txt 2>$OUT/bench.err
echo "bench rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/bench.err
python3 - <<'PY'
import json, statistics, os
d = json.load(open(os.environ["OUT"] + "/bench-models-linear-bert-vit.json"))
for dt in ("bfloat16", "float16"):
    r = [x for x in d["rows"] if x["dtype"] == dt and "speedup" in x]
    s = [x["speedup"] for x in r]
    print(dt, "n", len(s), "geomean %.3f" % statistics.geometric_mean(s), "worst %.3f" % min(s), "below0.9", sum(v < 0.9 for v in s))
    for x in r:
        if x["shape"].startswith(("8192x768, 3072", "12608x768, 3072")):
            print("  FFN", dt, round(x["speedup"], 3), x["shape"], x["layout"], x.get("route"))
PY
rm -f $OUT/bench.err
