# sourced by the GPU scripts: install (no deps, no index) and record the device
set -u
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 3; }
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c "import torch, triton, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('triton', triton.__version__); print('python', platform.python_version())"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>/dev/null || echo "transformers: absent"
  # no commit line: the device's copy carries the working tree but not this session's git state
  # (its HEAD is wherever the copy's .git stood); results/README.md names the code of each run
} > $OUT/device.txt
cat $OUT/device.txt
