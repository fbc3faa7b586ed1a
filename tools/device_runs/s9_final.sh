# session 9, run 3: the call-form host probe (with the driver's own launch cost), the matmul corpus
# in bf16 (not re-run since session 6), the element-wise corpus, the seed sizes, and the held-out
# GEMMs with the wall time per call of the launch-bound ones
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
timeout 120 python3 tools/probes/forms_host_probe.py > $OUT/forms-host-probe.txt 2>&1
echo "forms rc=$? $(( $(date +%s)-t0 ))s"; grep -E " xk |^part" $OUT/forms-host-probe.txt | cut -c1-100
timeout 200 python3 -m xkernels.bench --size models --op matmul --dtype bfloat16 --json $OUT/bench-models-matmul-bfloat16.json > $OUT/bench-models-matmul-bfloat16.txt 2>&1
echo "matmul bf16 rc=$? $(( $(date +%s)-t0 ))s"
timeout 150 python3 -m xkernels.bench --size models --op add,broadcast --json $OUT/bench-models-elementwise.json > $OUT/bench-models-elementwise.txt 2>&1
echo "elementwise rc=$? $(( $(date +%s)-t0 ))s"
timeout 120 python3 -m xkernels.bench --size small --json $OUT/bench-small.json > $OUT/bench-small.txt 2>&1
echo "small rc=$? $(( $(date +%s)-t0 ))s"
for f in bench-models-matmul-bfloat16 bench-models-elementwise bench-small; do python3 tools/device_runs/bench_summary.py $OUT/$f.json --worst 3; done
timeout 150 python3 tools/probes/unseen_gemms.py --json $OUT/unseen-gemms.json > $OUT/unseen-gemms.txt 2>&1
echo "unseen rc=$? $(( $(date +%s)-t0 ))s"; tail -1 $OUT/unseen-gemms.txt; grep "wall/call" $OUT/unseen-gemms.txt | grep "triton kernel"
