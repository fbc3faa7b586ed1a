# session 8: GEMM + activation in L2-sized chunks (l2_chunk_probe.py)
. tools/device_runs/common.sh
timeout 300 python3 tools/probes/l2_chunk_probe.py > $OUT/l2-chunk-probe.txt 2>&1
echo "rc=$?"; cat $OUT/l2-chunk-probe.txt | head -60
