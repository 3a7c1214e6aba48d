#!/usr/bin/env bash
# Everything that needs the GPU, in one go: tests/gpu, then the GPU benchmarks.
# Results (logs, CSV) go to ${OUT:-bench_results/gpu}. On the lent GPU machine, the device
# bundle provides Triton (see ../shared/TRITON_NOTES.md); elsewhere, run scripts/setup.sh first.
#   bash benchmarks/run_on_gpu.sh [pytest args...]
set -uo pipefail
out=${OUT:-bench_results/gpu}
mkdir -p "$out"
if [ -f .device_bundle/prelude.sh ]; then
  # shellcheck disable=SC1091
  source .device_bundle/prelude.sh
  # Triton's Python stub ignores PYTHONPATH: the carried wheels (nvmath-python for cuBLAS) must
  # be importable there too, or every KIND_GPU model fails its load.
  echo /tmp/site >> "$(python3 -c 'import site; print(site.getsitepackages()[0])')/zz_project_checkout.pth"
  # Tests read HugeCTR fixtures from ../shared, which does not travel: the bundle carries a copy.
  if [ -d .device_bundle/fixtures ] && [ ! -d ../shared/fixtures ]; then
    mkdir -p ../shared && cp -r .device_bundle/fixtures ../shared/
  fi
fi
export PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$out/gpu.txt"
"$python" -m pytest -q -p no:cacheprovider tests/gpu --durations=10 "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -25
"$python" benchmarks/gpu_cache_bench.py --out "$out" 2>&1 | tee "$out/gpu_cache_bench.log"
"$python" benchmarks/nn_forward_bench.py --out "$out" 2>&1 | tee "$out/nn_forward_bench.log" | tail -60
