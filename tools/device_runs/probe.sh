# One probe of tools/probes/ on the GPU: bash tools/device_runs/probe.sh PROBE NAME [ARGS...]
# runs `python3 tools/probes/PROBE.py ARGS` into $OUT/NAME.txt, adding `--json $OUT/NAME.json`
# where the probe writes JSON. e.g.
#   bash tools/device_runs/probe.sh ffn_rule_probe ffn-rule-probe-2048 --tokens 2048,4096
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
probe=tools/probes/$1.py; name=$2; shift 2
[ -f "$probe" ] || { echo "no probe $probe"; exit 2; }
json=(); grep -q '"--json"' "$probe" && json=(--json "$OUT/$name.json")
timeout 550 python3 "$probe" "${json[@]}" "$@" > "$OUT/$name.txt" 2>&1
echo "$1 rc=$?"; tail -20 "$OUT/$name.txt"
