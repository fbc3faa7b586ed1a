# session 9, run 4: host time of TMA plans at few tokens (tma_launch_probe.py; run as tma_host_probe.py, renamed after: that name was taken by session 3's probe), and the held-out
# GEMMs' text (run 3's unseen-gemms files were not returned: too many files)
. tools/device_runs/common.sh
export XKERNELS_CACHE_DIR=$(mktemp -d)
timeout 200 python3 tools/probes/tma_launch_probe.py > $OUT/tma-host-probe.txt 2>&1
echo "rc=$?"; grep -E "^M=|hot entry|wall/call" $OUT/tma-host-probe.txt
