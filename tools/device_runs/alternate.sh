# Whole models switching way every step (tools/probes/model_host_profile.py --alternate), after
# the cuda tests of the host-path suites. ARGS: model:pass pairs (default: the four zoo models'
# training steps); ROUNDS (env, default 30) rounds each; WAYS (env, default torch,enable,patch).
# The outputs are packed into alternate.tgz.
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
t0=$(date +%s)
XKERNELS_TEST_BACKENDS=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE tests/backends/test_native.py \
  tests/test_enable.py tests/ops/test_native_front_door.py tests/test_nn.py > $OUT/pytest-cuda-host-path.txt 2>&1
echo "tests rc=$? $(( $(date +%s)-t0 ))s"; tail -3 $OUT/pytest-cuda-host-path.txt
mkdir -p $OUT/alternate
for pair in ${@:-bert-base:step vit:step gpt2:step llama:step}; do
  model=${pair%%:*}; pass=${pair##*:}
  left=$(( 570 - ($(date +%s)-t0) )); [ $left -gt 30 ] || { echo "no time left for $pair"; break; }
  timeout $left python3 tools/probes/model_host_profile.py --model $model --pass $pass --steps 2 \
    --ways ${WAYS:-torch,enable,patch} --alternate ${ROUNDS:-30} > $OUT/alternate/$model-$pass.txt 2>&1
  echo "$pair rc=$? $(( $(date +%s)-t0 ))s"; sed -n '1,4p' $OUT/alternate/$model-$pass.txt
done
tar czf $OUT/alternate.tgz -C $OUT alternate pytest-cuda-host-path.txt && rm -r $OUT/alternate $OUT/pytest-cuda-host-path.txt
