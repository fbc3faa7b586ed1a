# The pre-norm sites' host cost on cuda, after their norm steps ask the op's native front door
# first: the block, host-path and add + norm site tests on cuda, then
# tools/probes/model_host_profile.py --alternate on mBART-large's and Whisper-small's forwards
# (host-bound on an H200), then `bench --host`.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_add_norm_forms.py \
  tests/test_blocks.py tests/test_host_path.py > $OUT/pytest-cuda.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; grep -E "^(FAILED|ERROR)" $OUT/pytest-cuda.txt | head; tail -1 $OUT/pytest-cuda.txt
XKERNELS_NATIVE=wait python3 -c "from xkernels.backends import native; m = native.module(wait=True); print('native', native.status())"
for m in mbart-large:8:512 whisper-small:8:64; do
  IFS=: read name b s <<< "$m"
  timeout 150 python3 tools/probes/model_host_profile.py --model tools/probes/data/$name.json --batch $b --seq $s \
    --pass forward --alternate 40 --steps 10 --top 15 > $OUT/host-profile-$name-forward.txt 2>&1
  echo "$name rc=$? $(( $(date +%s)-t0 ))s"; sed -n 1,3p $OUT/host-profile-$name-forward.txt
done
timeout $(( 570 - ($(date +%s)-t0) )) python3 -m xkernels.bench --host --rounds 9 > $OUT/host.txt 2>&1
echo "host rc=$? $(( $(date +%s)-t0 ))s"; cat $OUT/host.txt
