#!/usr/bin/env bash
# Download (here, where PyPI answers) the wheels scripts/gpu_check.sh installs on the GPU machine into .whl/
# (ignored by git; a device run carries it with carry: [".whl"]). Prints each wheel's size and the total,
# and fails when the wheels and the working tree together pass the 64 MiB a device run may carry.
#   scripts/gpu_wheels.sh            download what is missing
#   scripts/gpu_wheels.sh --check    only check what is there
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] && PY="${PYTHON:-.venv/bin/python}"
LIMIT=$((64 * 1024 * 1024))
mapfile -t WANT < <(grep -v '^\s*#' scripts/gpu_wheels.txt | sed '/^\s*$/d')
PLATFORMS=()
for n in 17 24 26 27 28 31 34 35; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
mkdir -p .whl
have() {  # the wheel of NAME==VERSION in .whl, if any (wheel names use _ for - and keep the version)
  local name=${1%%==*} version=${1##*==}
  ls .whl/"$(echo "$name" | tr '-' '_')"-"$version"-*.whl 2>/dev/null | head -1
}
if [ "${1:-}" != "--check" ]; then
  for spec in "${WANT[@]}"; do
    [ -n "$(have "$spec")" ] && continue
    "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp "${PLATFORMS[@]}" -d .whl "$spec" 2>&1 | grep -v '^WARNING: Location' || true
  done
fi
missing=0 total=0
printf '%-72s %10s\n' wheel bytes
for spec in "${WANT[@]}"; do
  f=$(have "$spec")
  if [ -z "$f" ]; then echo "MISSING $spec"; missing=1; continue; fi
  size=$(stat -c %s "$f"); total=$((total + size))
  printf '%-72s %10d\n' "$(basename "$f")" "$size"
done
for f in .whl/*.tar.gz; do  # FlashInfer kernels built ahead of time (scripts/gpu_aot.sh), if any
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f"); total=$((total + size))
  printf '%-72s %10d\n' "$(basename "$f")" "$size"
done
extra=$(ls .whl/*.whl 2>/dev/null | wc -l)
[ "$extra" -ne "${#WANT[@]}" ] && { echo "ERROR: .whl holds $extra wheels, the list ${#WANT[@]}: remove the others"; missing=1; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
tree=0  # the working tree that travels with a device run (where git can tell; the GPU machine's copy has no .git)
if command -v git >/dev/null && git rev-parse --git-dir >/dev/null 2>&1; then
  tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -cb 2>/dev/null | tail -1 | cut -f1)
fi
echo "wheels $total bytes ($(mib "$total") MiB) + working tree $tree bytes ($(mib "$tree") MiB)" \
  "= $(mib $((total + tree))) MiB of 64 MiB"
[ $((total + tree)) -le $LIMIT ] || { echo "ERROR: over the 64 MiB a device run carries"; exit 1; }
exit $missing
