# session 8: the FFN up-projection + activation rules at 4K-13K tokens (ffn_rule_probe.py)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
timeout 400 python3 tools/probes/ffn_rule_probe.py > $OUT/ffn-rule-probe.txt 2>&1
echo "rc=$?"; cat $OUT/ffn-rule-probe.txt | tail -20
