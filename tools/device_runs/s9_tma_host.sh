# session 9, run 4: host time of TMA plans at few tokens (tma_host_probe.py), and the held-out
# GEMMs' text (run 3's unseen-gemms files were not returned: too many files)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
timeout 200 python3 tools/probes/tma_host_probe.py > $OUT/tma-host-probe.txt 2>&1
echo "rc=$?"; grep -E "^M=|hot entry|wall/call" $OUT/tma-host-probe.txt
