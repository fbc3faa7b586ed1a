# session 8: Triton's warp specialization on the fused TMA kernel (ws_gemm_probe.py)
. tools/device_runs/common.sh
timeout 500 python3 tools/probes/ws_gemm_probe.py > $OUT/ws-gemm-probe.txt 2>&1
echo "rc=$?"; grep -v "^  [0-9].*Error" $OUT/ws-gemm-probe.txt | head -80
