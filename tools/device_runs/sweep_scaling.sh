# Sweep scaling on a 2-GPU host (nvidia-h200-x2): the same linear sweep in 1 process and in 2
# (torchrun), each with a fresh Triton cache, then each rank's timing breakdown (first calls,
# Triton compiles, timing, inputs, progress, sync/wait, tables) and the throughput ratio.
# SWEEP_ARGS overrides what is swept (default: the reported BERT-base bf16 sweep); LIMIT_S the
# time each run may take (a run cut short leaves its checkpoints: its JSON is then missing).
. tools/device_runs/common.sh
ARGS=${SWEEP_ARGS:-"--backend cuda --op linear --shapes models --model bert-base --dtype bf16 --reps 10"}
LIMIT=${LIMIT_S:-270}
t0=$(date +%s)
for n in 1 2; do
  export TRITON_CACHE_DIR=$(mktemp -d)   # cold cache; both ranks of the 2-process run share it
  export XKERNELS_CACHE_DIR=$(mktemp -d)
  s=$(date +%s)
  if [ $n = 1 ]; then
    timeout $LIMIT python3 -m xkernels.tune $ARGS --out-dir $OUT/p$n > $OUT/sweep-p$n.txt 2>&1
  else
    timeout $LIMIT torchrun --standalone --nproc-per-node 2 -m xkernels.tune $ARGS --out-dir $OUT/p$n \
      > $OUT/sweep-p$n.txt 2>&1
  fi
  echo "== $n process(es): rc=$? $(( $(date +%s)-s ))s; Triton cache: $(find $TRITON_CACHE_DIR -name '*.cubin' | wc -l) cubins"
  grep -E "xkernels.tune linear:|rank [0-9]:" $OUT/sweep-p$n.txt | cut -c1-400
  wc -l $OUT/p$n/checkpoints/*.jsonl 2>/dev/null
done
python3 - $OUT <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
got = {}
for n in (1, 2):
    p = out / f"p{n}" / "linear.json"
    if not p.exists():
        print(f"{n} process(es): no table (cut short?)"); continue
    s = json.loads(p.read_text())["sweep"]
    got[n] = s
    print(f"{n} process(es): {s['measured']} items measured in {s['seconds']} s = {s['measured'] / s['seconds']:.2f} items/s")
    for r in s["ranks"]:
        keys = ("first_call_s", "compile_s", "compiles", "cache_hits", "timing_s", "torch_timing_s", "inputs_s",
                "progress_s", "sync_s", "tables_s", "other_s", "wall_s")
        print("  rank", r["rank"], {k: r[k] for k in keys})
if len(got) == 2:
    r1, r2 = (got[n]["measured"] / got[n]["seconds"] for n in (1, 2))
    print(f"throughput 2 processes / 1: {r2 / r1:.2f}x")
    a, b = (json.loads((out / f"p{n}/linear.json").read_text())["archs"] for n in (1, 2))
    print("rules equal:", a == b, "(timings differ between runs, so rules may too)")
PY
echo "total $(( $(date +%s)-t0 ))s"
