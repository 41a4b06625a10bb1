#!/usr/bin/env bash
# Everything the GPU path needs checked, in one go, on a machine with a GPU (the lab's H100 through
# the device tool): install PyCUDA from a wheelhouse, build the PTX, run every test (GPU ones
# included), then the lab's bar and the benchmark. Logs and figures go to $OUT (default out/gpu).
#   tools/gpu-check.sh [tests] [bar] [bench]     (default: all three)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ! python3 -c "import pycuda" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheelhouse/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
stages=${*:-tests bar bench}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
python3 build.py --force || exit 2
status=0
for stage in $stages; do
  case $stage in
    tests)
      python3 -m pytest -q -rs -p no:cacheprovider tests 2>&1 | tee "$OUT/tests.log" || status=1 ;;
    bar)  # issue 3's bar: 10,000 generated images, cuda against cpu under the lab's rule
      work=$(mktemp -d)
      python3 -m cnnlab generate --images 10000 --seed 459 --out-dir "$work"
      for mode in cpu cuda; do
        /usr/bin/time -f "$mode wall %e s, peak RSS %M KB" python3 -m cnnlab $mode "$work/cnn.csv" "$work/in.csv" "$work/out_$mode.csv"
      done 2>&1 | tee "$OUT/bar.log"
      python3 -m cnnlab compare "$work/out_cpu.csv" "$work/out_cuda.csv" 2>&1 | tee -a "$OUT/bar.log" || status=1 ;;
    bench)
      python3 -m cnnlab bench --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.log" || status=1 ;;
  esac
done
exit $status
