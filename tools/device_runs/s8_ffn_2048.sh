# session 8: the FFN up + activation class at 1025-4096 tokens (ffn_rule_probe.py at 2048 and 4096)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
timeout 300 python3 tools/probes/ffn_rule_probe.py --tokens 2048,4096 > $OUT/ffn-rule-probe-2048.txt 2>&1
echo "rc=$?"; tail -10 $OUT/ffn-rule-probe-2048.txt
