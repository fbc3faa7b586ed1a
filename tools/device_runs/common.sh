# Sourced by the device scripts: install the working tree (no dependencies, no index) and record
# the device and versions in $OUT/device.txt. The device's copy carries the working tree, not git
# state, so device.txt names no commit: each results/<run>/README.md says which code ran.
set -u
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . > $OUT/install.log 2>&1 || { cat $OUT/install.log; exit 3; }
rm -f $OUT/install.log
# a transformers wheel carried in .whl/ (run's `carry`; the device reaches no index) is used instead
# of the device's own, from a directory of its own on PYTHONPATH
if ls .whl/transformers-*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-deps --target /tmp/xk-transformers .whl/transformers-*.whl > /dev/null 2>&1 \
    && export PYTHONPATH=/tmp/xk-transformers${PYTHONPATH:+:$PYTHONPATH}
fi
{
  date -u +"date: %Y-%m-%dT%H:%M:%SZ"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/gpu: /'
  python3 -c "import torch, triton, platform; print('torch', torch.__version__, 'cuda', torch.version.cuda); print('triton', triton.__version__); print('python', platform.python_version())"
  python3 -c "import transformers; print('transformers', transformers.__version__)" 2>/dev/null || echo "transformers: absent"
} > $OUT/device.txt
cat $OUT/device.txt
