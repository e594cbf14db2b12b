#!/usr/bin/env bash
# The GPU check of walkserve, in one run on a machine with a CUDA GPU (an H200 lent through the device tool):
#   1. install the wheels carried in .whl/ (scripts/gpu_wheels.sh fetched them) into /tmp/site, no network;
#   2. FlashInfer's cold start, timed (import + the first build of every kernel module), in the background;
#   3. pytest -m gpu: CUDA against CPU (attention ops, every family's parity, CUDA graphs against eager),
#      the FlashInfer tests once step 2 is done;
#   4. the model benchmarks with --device cuda on small models (lm, tts, moe, vjepa-offline);
#   5. one folder of logs and tables, at most 8 files: summary.md (conditions, the time of every part,
#      parity, CUDA-graph speed-ups, FlashInfer's cold start, the benchmarks' verdict lines), pytest.log,
#      gpu_report.jsonl (every measurement), flashinfer_jit.log, bench_lm.md, bench_tts.md, bench_more.md.
#
#   scripts/gpu_check.sh [--dry-run] [--only PARTS] [--out DIR]
#     --dry-run    on this CPU machine: check the wheels (names, sizes, that pip takes them for CPython 3.12
#                  x86-64) and run every part's command small on the CPU (tests CPU against CPU with the
#                  FlashInfer stand-in, --quick benchmarks), so the script's logic is tried without a GPU
#     --only P     comma-separated parts: install,jit,tests,lm,tts,more (default all; a rerun takes what failed)
#     --out DIR    where the files go (default $OUT, else ./out/gpu-check)
# Budget (device run): about 6 minutes expected; every part has its own time cap and the whole run at most
# GPU_CHECK_BUDGET seconds (default 420), the summary always written. The device call:
#   carry [".whl"], timeout_s 450, command: bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
DRY=0 ONLY="install,jit,tests,lm,tts,more" DEST="${OUT:-$ROOT/out/gpu-check}"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --only) ONLY="$2"; shift ;;
    --out) DEST="$2"; shift ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$DEST"
PY="${PYTHON:-python3}"
[ $DRY = 1 ] && [ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
SITE=/tmp/walkserve-site
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TOKENIZERS_PARALLELISM=false WALKSERVE_GPU_REPORT="$DEST/gpu_report.jsonl"
export FLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-9.0a}" MAX_JOBS="${MAX_JOBS:-16}"  # H200: sm_90a, as FlashInfer detects it
TIMES="$DEST/.times"  # part, seconds, status (folded into summary.md, then removed)
: > "$TIMES"
: > "$WALKSERVE_GPU_REPORT"
want() { [[ ",$ONLY," == *",$1,"* ]]; }
BUDGET=${GPU_CHECK_BUDGET:-420}  # seconds for the whole run: a part gets at most what is left (15 s kept for the summary)
part() {  # part NAME CAP_SECONDS LOG COMMAND...: run, time, record
  local name=$1 cap=$2 log=$3; shift 3
  local t0=$SECONDS status left=$((BUDGET - SECONDS - 15))
  if [ $left -lt 10 ]; then
    echo "== $name: SKIPPED, the run's budget of ${BUDGET}s is spent" | tee -a "$log"
    printf '%s\t0\tskipped\n' "$name" >> "$TIMES"
    return 1
  fi
  [ $left -lt "$cap" ] && cap=$left
  echo "== $name (cap ${cap}s) $(date +%T)" | tee -a "$log"
  if declare -F "$1" >/dev/null; then  # a function of this script (quick): no cap
    "$@" >> "$log" 2>&1
  else
    timeout --kill-after=10 "$cap" "$@" >> "$log" 2>&1
  fi
  status=$?
  [ $status = 124 ] && echo "== $name: TIMED OUT after ${cap}s" >> "$log"
  printf '%s\t%d\t%d\n' "$name" $((SECONDS - t0)) $status >> "$TIMES"
  echo "== $name: exit $status in $((SECONDS - t0)) s" | tee -a "$log"
  return $status
}

# ---- conditions -----------------------------------------------------------------------------------
ENV="$DEST/.env"
{
  echo "- date: $(date -u +%FT%TZ); host cores: $(nproc); mode: $([ $DRY = 1 ] && echo 'dry run (CPU)' || echo GPU)"
  if command -v nvidia-smi >/dev/null; then
    echo "- nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
  fi
  echo "- nvcc: $(nvcc --version 2>/dev/null | tail -2 | head -1 || echo none)"
  echo "- python: $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  echo "- transformers: $("$PY" -c 'import transformers; print(transformers.__version__)' 2>&1 | tail -1)"
} > "$ENV"
cat "$ENV"

# ---- 1. wheels ----------------------------------------------------------------------------------------
PLATFORMS=()
for n in 17 24 26 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
install_wheels() {
  scripts/gpu_wheels.sh --check || return 1
  if [ $DRY = 1 ]; then  # resolve them as the GPU machine's pip would, without installing
    "$PY" -m pip install --dry-run -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
      --python-version 3.12 --implementation cp "${PLATFORMS[@]}" --target "$SITE-dry" .whl/*.whl || return 1
    echo "pip accepts every wheel for CPython 3.12 x86-64"
    for aot in .whl/flashinfer-aot-*.tar.gz; do
      [ -f "$aot" ] && echo "FlashInfer AOT modules in $aot: $(tar -tzf "$aot" | grep -c '\.so$')"
    done
    return 0
  fi
  rm -rf "$SITE"
  "$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl/*.whl || return 1
  # walkserve's own metadata (its entry points name the fixture families), as an editable install would add it
  "$PY" - "$SITE" <<'EOF'
import sys, tomllib, pathlib
site, meta = pathlib.Path(sys.argv[1]), tomllib.loads(pathlib.Path("pyproject.toml").read_text())
info = site / f"walkserve-{meta['project']['version']}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: walkserve\nVersion: {meta['project']['version']}\n")
groups = meta["project"].get("entry-points", {})
(info / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                                              for g, eps in groups.items()))
EOF
  aot=$(ls .whl/flashinfer-aot-*.tar.gz 2>/dev/null | head -1)
  if [ -n "$aot" ]; then  # kernels built ahead of time (scripts/gpu_aot.sh): FlashInfer loads them, no JIT
    mkdir -p "$SITE/flashinfer/data/aot" && tar -C "$SITE/flashinfer/data/aot" -xzf "$aot" &&
      echo "FlashInfer AOT modules from $aot: $(ls "$SITE/flashinfer/data/aot" | tr '\n' ' ')"
  fi
  "$PY" -c "import msgspec, zmq, setproctitle, soundfile, snac, flashinfer, walkserve.entrypoint.engine; print('imports ok')"
}
if want install; then
  [ $DRY = 1 ] || export PYTHONPATH="$SITE:$PYTHONPATH"
  part install 120 "$DEST/pytest.log" install_wheels || echo "install failed: the parts below run with what imports"
elif [ $DRY = 0 ] && [ -d "$SITE" ]; then
  export PYTHONPATH="$SITE:$PYTHONPATH"
fi

# ---- 2. FlashInfer's cold start (background) -----------------------------------------------------------
JIT_PID=""
if want jit; then
  SELF=(); [ $DRY = 1 ] && SELF=(--self-check)
  # 64: every FlashInfer test's and benchmark's head dim (FA2 takes multiples of 64; smaller ones use torch)
  part jit 330 "$DEST/flashinfer_jit.log" "$PY" scripts/gpu_warmup.py --head-dims 64 \
    --report "$WALKSERVE_GPU_REPORT" "${SELF[@]}" &
  JIT_PID=$!
fi

# ---- 3. pytest -m gpu ---------------------------------------------------------------------------------------
GPU_TESTS=(tests/gpu tests/layers/test_attention_paged.py tests/layers/test_moe_cuda.py
           tests/engines/kv/test_contexts_gpu.py tests/engines/kv/test_engine.py)
PYTEST=("$PY" -m pytest -m gpu -q -rfEs -p no:cacheprovider --timeout 240 "${GPU_TESTS[@]}")
[ $DRY = 1 ] && export WALKSERVE_GPU_TEST_DEVICE=cpu OMP_NUM_THREADS=1
if want tests; then
  part tests-cuda 200 "$DEST/pytest.log" "${PYTEST[@]}" -k "not flashinfer"
fi
if [ -n "$JIT_PID" ]; then
  wait "$JIT_PID"
fi
if want tests; then
  part tests-flashinfer 120 "$DEST/pytest.log" "${PYTEST[@]}" -k flashinfer
fi

# ---- 4. benchmarks with --device cuda -----------------------------------------------------------------
DEV=cuda QUICK=()
[ $DRY = 1 ] && DEV=cpu QUICK=(--quick)
if want lm; then
  part bench-lm 150 "$DEST/bench_lm.md" "$PY" -m benchmarks lm --device $DEV "${QUICK[@]}" --cuda-graphs
fi
if want tts; then
  TTS=(--concurrency 1,4,16 --frames 24 --baseline-requests 2)
  [ $DRY = 1 ] && TTS=(--concurrency 1,3 --baseline-requests 1)
  [ $DRY = 0 ] && TTS+=(--cuda-graphs)
  part bench-tts 150 "$DEST/bench_tts.md" "$PY" -m benchmarks tts --device $DEV "${QUICK[@]}" "${TTS[@]}"
fi
if want more; then
  MOE=(--tokens 1,8,64,512,4096); [ $DRY = 1 ] && MOE=(--tokens 1,16 --repeats 1 --dtype float32)
  part bench-moe 60 "$DEST/bench_more.md" "$PY" -m benchmarks moe --device $DEV "${QUICK[@]}" "${MOE[@]}"
  VJ=(--preset bench); [ $DRY = 1 ] && VJ=(--preset tiny --horizons 2 --repeat 1)
  part bench-vjepa-offline 60 "$DEST/bench_more.md" "$PY" -m benchmarks vjepa-offline --device $DEV "${VJ[@]}"
  # the other benchmarks (a family's ./dev bench NAME) run with --quick here, those that take --device
  for name in $("$PY" -c "from benchmarks.__main__ import BENCHMARKS; print(' '.join(BENCHMARKS))"); do
    case " runtime lm tts moe vjepa-offline " in *" $name "*) continue ;; esac
    if ! "$PY" -m benchmarks "$name" --help 2>/dev/null | grep -q -- "--device"; then
      echo "bench-$name: skipped (it has no --device option; it runs on the CPU only)" >> "$DEST/bench_more.md"
      continue
    fi
    part "bench-$name" 60 "$DEST/bench_more.md" "$PY" -m benchmarks "$name" --device $DEV --quick
  done
fi

# ---- 5. summary -------------------------------------------------------------------------------------------
"$PY" scripts/gpu_summary.py "$DEST" "$ENV" "$TIMES" > "$DEST/summary.md"
rm -f "$TIMES" "$ENV"
cat "$DEST/summary.md"
files=$(find "$DEST" -type f | wc -l)
bad=$(find "$DEST" -type f | grep -v '^[A-Za-z0-9/._-]*$' | wc -l)
echo "gpu_check: $files files in $DEST (at most 8 come back), $bad with unusual names"
[ "$files" -le 8 ] && [ "$bad" = 0 ]
