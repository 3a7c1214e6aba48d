#!/usr/bin/env bash
# What needs the GPU, one part per call (each fits the lent machine's 10-minute commands):
#   bash benchmarks/run_on_gpu.sh tests [pytest args...]  # tests/gpu, files spread over workers
#   bash benchmarks/run_on_gpu.sh torch   # the PyTorch module against nn.EmbeddingBag (eager and
#                                         # compiled, FP32 and TF32), its profile, and served
#   bash benchmarks/run_on_gpu.sh large   # a table of ${GB:-32} GB: load, then lookups
#   bash benchmarks/run_on_gpu.sh bench   # the GPU cache and dense-network benchmarks
# Results (logs, CSV) go to ${OUT:-bench_results/gpu}/PART. On the lent GPU machine, the device
# bundle provides Triton (see ../shared/TRITON_NOTES.md); elsewhere, run scripts/setup.sh first.
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
part=${1:-tests}
[ $# -gt 0 ] && shift
out="$out/$part"
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee -a "$out/gpu.txt"
case "$part" in
  tests)
    "$python" -m pytest -q -p no:cacheprovider -n "${JOBS:-10}" --dist loadfile tests/gpu -rfE \
      --durations=10 "$@" 2>&1 | tee "$out/gpu_tests.log" | tail -25
    ;;
  torch)
    "$python" benchmarks/torch_plugin_vs_pytorch.py --dir /tmp/tpp --out "$out" \
      --precisions fp32,tf32 --modes eager,compile --steps 20 --max-rows 300000 \
      2>&1 | tee "$out/torch_plugin_vs_pytorch.log" | tail -40
    for cache in static 0.2; do
      "$python" benchmarks/torch_plugin_profile.py --dir /tmp/tpp --out "$out/profile_$cache" \
        --max-rows 300000 --batches 1,16384 --cache "$cache" > "$out/profile_$cache.log" 2>&1
    done
    "$python" benchmarks/make_large_dlrm.py --dcnv2 --out /tmp/dlrm_v2 \
      --max-rows-per-table 300000 > "$out/make_large_dlrm.log" 2>&1
    "$python" benchmarks/torch_model_serve.py --ps-json /tmp/dlrm_v2/ps.json --kind KIND_GPU \
      --samples 1,256 --concurrency 1,8 --window-ms 1500 --out "$out" \
      2>&1 | tee "$out/torch_model_serve.out" | tail -12
    ;;
  large)
    "$python" benchmarks/large_table.py --gb "${GB:-32}" --lookups --out "$out" \
      2>&1 | tee "$out/large_table.log" | tail -40
    ;;
  bench)
    "$python" benchmarks/gpu_cache_bench.py --out "$out" 2>&1 | tee "$out/gpu_cache_bench.log"
    "$python" benchmarks/nn_forward_bench.py --out "$out" 2>&1 | tee "$out/nn_forward_bench.log" \
      | tail -60
    ;;
  *)
    echo "run_on_gpu.sh: unknown part '$part' (tests, torch, large or bench)" >&2
    exit 2
    ;;
esac
