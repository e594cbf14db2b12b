#!/usr/bin/env bash
# Optional, here (a CPU machine with CUDA's nvcc): build, ahead of time, the FlashInfer kernel modules walkserve's
# GPU check uses, for the H200 (sm_90a), into .whl/flashinfer-aot-<version>-sm90a.tar.gz. gpu_check.sh unpacks
# them into FlashInfer's AOT folder (flashinfer/data/aot/<module>/<module>.so), which FlashInfer loads instead of
# compiling; a module that fails to load there is deleted and compiled on the spot, as without this file.
# The modules: batch prefill (bf16, head dim 64, FA2: decode, prefill, ragged, every mask), cascade (merge_state),
# quantization (segment_packbits, for custom masks). Takes ~30 min of one core (nice 19); MAX_JOBS=N for more.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
FI=$(grep '^flashinfer-python==' scripts/gpu_wheels.txt | cut -d= -f3)
FFI=$(grep '^apache-tvm-ffi==' scripts/gpu_wheels.txt | cut -d= -f3)
SITE=${AOT_SITE:-/tmp/walkserve-aot-site} WORK=${AOT_WORK:-/tmp/walkserve-aot-build}
command -v nvcc >/dev/null || { echo "gpu_aot: no nvcc on this machine" >&2; exit 1; }
"$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$SITE" \
  "flashinfer-python==$FI" "apache-tvm-ffi==$FFI" nvidia-ml-py tabulate click 2>&1 | grep -v '^WARNING' || true
mkdir -p .whl "$WORK/stubs"
OUT_TAR="$(pwd)/.whl/flashinfer-aot-$FI-sm90a.tar.gz"
# CUDA's own folder (FlashInfer links with -L$CUDA_HOME/lib64 -lcudart), and a stub libcuda for the link: a machine
# without a GPU driver has no libcuda.so (the module needs none of its symbols: the stub is dropped as not needed)
export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}"
if [ -f "$CUDA_HOME/bin/nvcc" ] && grep -q exec "$CUDA_HOME/bin/nvcc" 2>/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(awk '/exec/ {print $2}' "$CUDA_HOME/bin/nvcc")")")  # a wrapper script
fi
[ -e /usr/local/cuda/lib64/libcudart.so ] && [ ! -e "$CUDA_HOME/lib64/libcudart.so" ] && CUDA_HOME=/usr/local/cuda
echo "" | gcc -shared -x c - -o "$WORK/stubs/libcuda.so" -Wl,-soname,libcuda.so.1
export LIBRARY_PATH="$WORK/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
echo "CUDA_HOME=$CUDA_HOME"
FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE="$WORK" MAX_JOBS="${MAX_JOBS:-1}" PYTHONPATH="$SITE" \
  nice -n 19 "$PY" - "$WORK/aot" <<'EOF'
import shutil, sys, time
from pathlib import Path

import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module
from flashinfer.jit.cascade import gen_cascade_module
from flashinfer.quantization import gen_quantization_module

out = Path(sys.argv[1])
specs = [gen_batch_prefill_module("fa2", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, 64, 64, 0,
                                  False, False, False), gen_cascade_module(), gen_quantization_module()]
for spec in specs:
    if (out / spec.name / f"{spec.name}.so").exists():  # built by an earlier run
        print(f"{spec.name}: already built", flush=True)
        continue
    t0 = time.time()
    spec.build(verbose=False)
    (out / spec.name).mkdir(parents=True, exist_ok=True)
    shutil.copy(spec.get_library_path(), out / spec.name / f"{spec.name}.so")
    print(f"{spec.name}: {time.time() - t0:.0f} s", flush=True)
EOF
tar -C "$WORK/aot" -czf "$OUT_TAR" .
ls -l "$OUT_TAR"
