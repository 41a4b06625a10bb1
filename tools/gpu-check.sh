#!/usr/bin/env bash
# Everything the GPU path needs checked, on a machine with a GPU (the lab's H100 through the device
# tool): install the wheels in .wheelhouse (PyCUDA and its needs), build the native CSV parser for
# this Python and the kernels' fatbins, then the stages asked for. Logs and figures go to $OUT
# (default out/gpu); big files to $WORK (default /tmp), the 30,000-image job's kept for every stage that uses it.
#   tools/gpu-check.sh [STAGE ...]   (default: tests bench bar startup npy memory failrate long ladder)
#   tests     every test, GPU ones and the fuzz tests' long profiles (--long) included, on every core
#   bench     cnnlab bench, every row, with --json and --plot
#   ladder    the optimization ladder: its tests, the top rungs' tuning sweeps (tools/ladder_sweep.py) and SASS counts,
#             then cnnlab bench --rows kernels,peers with --json and --plot
#   bar       10,000 CSV images: cpu, cuda (CSV parsed on the GPU) and cuda --host-parse agree, and their wall times
#             (also cpu --no-read-ahead and cuda --batch 512)
#   gpus      cuda mode started for GPU 0 (and for GPUs 0 and 1) against the same runs with CUDA_VISIBLE_DEVICES set to
#             those GPUs, whole processes in turns, a second's settle before each (tools/paired_wall.py); then what the
#             host can feed 1..N GPUs copying at once (tools/h2d_bound.py); the bench's startup and gpus rows (what 2..N
#             GPUs cost to start, in one process and in as many at once; their copies at once)
#   startup   the default data (4 images) in cpu and cuda mode, three times each: wall time and start-up
#   npy       65,536 images in a .npy file in the page cache: the compute loop's rate
#   memory    peak RSS of 2,000 and 20,000 images, cpu and cuda, CSV and .npy
#   failrate  100,000 images: how many outputs fail the lab's comparison, cuda against cpu
#   long      200,000 images from .npy through cuda: a long run's wall time, rate and memory
#   crossover cpu against cuda on CSV files of 4 to 3,000 images: from how many images the GPU pays off
#   parsers   the native CSV parser on 1..16 threads (MB/s, tools/bench_lab_csv.py) and csv.cu's kernels (GB/s of text,
#             tools/bench_csv_gpu.py), 1,000 images; each stage of cpu mode's CSV reading alone on 1..16 threads
#             (tools/profile_cpu_csv.py, 2,000 images)
#   cpu       cnnlab bench's cpu and reader rows on every core and on one: the forward against the memory bound, the
#             plain loop, numpy and PyTorch on the CPU; the CSV reader against numpy.loadtxt and Polars
#   parser    the CSV parser alone: the pinned one-thread run's CSV time over its .npy time, each row parser against
#             std::from_chars on one core, 1..16 threads' scaling (tools/bench_parser.py, 2,000 images); the bench's
#             reader rows (a ~1 GB file, the reader against from_chars on the same threads); then the
#             30,000-image cpu job's wall (5.6 GB, page cache), three runs
#   cpujob    30,000 CSV images (5.6 GB, page cache): cnnlab cpu's wall time, three runs, against cuda's, outputs compared,
#             and each mode's phases (tools/profile_startup.py)
#   trace     the same job in cpu and cuda mode without and with --trace (and --trace-chunks in cuda mode), in turns in one
#             process (the loop's seconds and their ratios: tools/trace_overhead.py), a trace of each drawn by trace-plot
#             into $OUT (cuda's with --trace-chunks too), and tests/test_trace.py
#   two       rung 12 (the card's two kernels, rung 9's conv and rung 7's dense) at several pass sizes beside rungs 6
#             and 7, each kernel alone, and the resident row with each (tools/ladder_sweep.py two)
#   dask      the Dask path's tests (a local cluster of worker processes, the cuda backend among them), and the Dask
#             path on one GPU against CudaContext.forward on the same .npy images (tools/bench_dask.py; Dask's wheels
#             travel in .wheelhouse)
#   tune      cpu mode's CSV reader on every core with other shares of its threads reading ahead and other steps
#             (tools/profile_cpu_csv.py)
#   profile   where cpu and cuda mode's time goes on the default data, from the process's start to its exit
#             (tools/profile_startup.py), beside the driver's own start in C through ctypes (the floor)
#   sweep     the page-locked row against the copy bound for a few chunk sizes and stream counts
#   against   this tree against the checkout at $BEFORE (built here too), in turns: the default data, 30,000 CSV images
#             and 200,000 .npy images through cuda mode, outputs byte for byte, wall, start-up and loop seconds and their
#             ratios, peak GPU memory (tools/against.py)
#   sizes     the 30,000-image CSV loop at several TEXT_BUFFER_BYTES and the 200,000-image .npy loop at several
#             DEFAULT_BUFFER_IMAGES (tools/with_sizes.py), five turns, then the default data and 3,000 CSV images: loop
#             seconds and peak GPU memory above the level before (TURNS, TEXT_SIZES and IMAGE_SIZES choose others)
#   csvwalls  cuda against cpu on CSV files of 10,000, 15,000 and 30,000 images, whole processes in turns
#             (tools/paired_wall.py, five pairs each)
#   account   where each run's GPU memory goes (tools/gpu_memory.py): the default data, 3,000 and 30,000 CSV images and
#             200,000 .npy images; then the same runs on a shared GPU, another process holding all but 1,000, 700
#             and 300 MB (tests/gpu_memory_holder.py): status, stderr's lines, outputs against cpu's
#   api       the Python API's tests (PyTorch and CuPy device arrays, out=), its device-array rate, and a wheel
#             built here, installed into a fresh virtual environment with nvcc off the PATH, running cuda mode
#             from outside the checkout (numpy for that environment: a wheel in .venvwheels/, as .wheelhouse's)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
WORK=${WORK:-/tmp}/cnnlab-gpu-check
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
if compgen -G ".wheelhouse/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheelhouse/*.whl
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
# This machine's Python writes no bytecode (PYTHONDONTWRITEBYTECODE=1) and its numpy ships none, so every
# process compiled numpy and cnnlab from source: 0.2-0.3 s of each start-up (0.49 s against 0.28-0.32 s for the
# default data in cuda mode). An installed package has its bytecode (pip writes it), so these runs get theirs,
# cached outside the checkout and written by a first run of each mode.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=$WORK/pycache
stages=${*:-tests bench bar startup npy memory failrate long ladder}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device.txt"
{ nproc; lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|MHz|L2|L3|NUMA node\(s\)|Flags" | cut -c1-200; free -g | head -2; } | tee -a "$OUT/device.txt"
python3 setup.py -q build_ext --inplace 2>&1 | tail -3 || exit 2
python3 build.py --force || exit 2
cnnlab() { python3 -m cnnlab "$@"; }
for mode in cpu cuda; do cnnlab $mode "data/cnn.csv" "data/in.csv" "$WORK/warm.csv" > /dev/null 2>&1; done
job30k() {  # the 30,000-image CSV job (5.6 GB) in $WORK/job, in the page cache: the lab's data at scale (made once)
  if [ ! -f "$WORK/job/in30k.csv" ]; then
    cnnlab generate --images 10000 --seed 459 --out-dir "$WORK/job"
    (echo 30000; for _ in 1 2 3; do tail -n +2 "$WORK/job/in.csv"; done) > "$WORK/job/in30k.csv"
  fi
  cat "$WORK/job/in30k.csv" > /dev/null
}
job3k() {  # 3,000 CSV images beside the 30,000-image job, as $WORK/job/in3k.csv (made once)
  job30k
  [ -f "$WORK/job3k/in.csv" ] || cnnlab generate --images 3000 --seed 3 --out-dir "$WORK/job3k"
  ln -sf "$WORK/job3k/in.csv" "$WORK/job/in3k.csv"
}
npy200k() {  # 200,000 fresh images in $WORK/job/in200k.npy (16 GB), in the page cache (made once)
  [ -f "$WORK/job/in200k.npy" ] || random_npy "$WORK/job/in200k.npy" 200000
  cat "$WORK/job/in200k.npy" > /dev/null
}
timed() { /usr/bin/time -f "$1: wall %e s, peak RSS %M KB" "${@:2}"; }
random_npy() {  # random_npy PATH N: N fresh images, uniform in [-10, 10], written in blocks
  python3 -c "
import sys, numpy as np
n = int(sys.argv[2]); rng = np.random.default_rng()
out = np.lib.format.open_memmap(sys.argv[1], 'w+', np.float64, (n, 100, 100))
for s in range(0, n, 4096): out[s:s + 4096] = rng.uniform(-10, 10, (min(4096, n - s), 100, 100))
out.flush()" "$1" "$2"
}
status=0
for stage in $stages; do
  echo "== $stage" | tee -a "$OUT/stages.log"
  case $stage in
    tests)
      # On every core where pytest-xdist is installed (the GPU's users take turns: tests/conftest.py's lock).
      workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n auto")
      python3 -m pytest -q -rs -p no:cacheprovider $workers --long tests 2>&1 | tee "$OUT/tests.log" || status=1 ;;
    bench)
      cnnlab bench --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.log" || status=1 ;;
    ladder)
      python3 -m pytest -q -rs -p no:cacheprovider tests/test_ladder.py 2>&1 | tee "$OUT/ladder_tests.log" || status=1
      {
        python3 tools/ladder_sweep.py
        cuobjdump --dump-sass --gpu-architecture sm_90 kernel/ladder/09_fused_tiled.fatbin > "$WORK/fused_tiled.sass" &&
          for op in DMUL DADD DFMA LDS LDGSTS BAR.SYNC; do echo "fused_tiled SASS (sm_90): $op $(grep -c "$op" "$WORK/fused_tiled.sass")"; done
      } 2>&1 | tee "$OUT/ladder_sweep.log" || status=1
      cnnlab bench --rows kernels,peers --json "$OUT/ladder.json" --plot "$OUT/ladder.png" 2>&1 | tee "$OUT/ladder.log" || status=1 ;;
    bar)
      cnnlab generate --images 10000 --seed 459 --out-dir "$WORK/bar"
      cat "$WORK/bar/in.csv" > /dev/null  # in the page cache
      {
        for run in "cpu" "cpu --no-read-ahead" "cuda" "cuda --host-parse" "cuda --batch 512"; do
          name=$(echo $run | tr -d ' -')
          timed "$run" python3 -m cnnlab $run "$WORK/bar/cnn.csv" "$WORK/bar/in.csv" "$WORK/bar/out_$name.csv" --timing-json "$OUT/bar_$name.json"
          python3 -c "import json, sys; f = json.load(open(sys.argv[1])); print('  loop', round(f['loop_seconds'], 3), 's,', round(f['loop_images_per_second']), 'images/s; start-up', f['startup_seconds'])" "$OUT/bar_$name.json"
        done
        cnnlab compare "$WORK/bar/out_cpu.csv" "$WORK/bar/out_cuda.csv"
        cmp "$WORK/bar/out_cuda.csv" "$WORK/bar/out_cudahostparse.csv" && echo "cuda: GPU-parsed and host-parsed outputs are identical"
      } 2>&1 | tee "$OUT/bar.log" || status=1
      rm -rf "$WORK/bar" ;;
    gpus)
      {
        gpus=$(nvidia-smi -L | wc -l)
        run="python3 -m cnnlab cuda data/cnn.csv data/in.csv $WORK/gpus.csv"
        echo "cuda on GPU 0 (A) against the same with CUDA_VISIBLE_DEVICES=0 (B), the default data, of $gpus GPUs:"
        python3 tools/paired_wall.py --pairs 7 --settle 1 --a "env -u CUDA_VISIBLE_DEVICES $run" --b "env CUDA_VISIBLE_DEVICES=0 $run"
        if [ "$gpus" -ge 2 ]; then
          echo "--devices 0,1 (A) against the same with CUDA_VISIBLE_DEVICES=0,1 (B):"
          python3 tools/paired_wall.py --pairs 7 --settle 1 --a "env -u CUDA_VISIBLE_DEVICES $run --devices 0,1" \
            --b "env CUDA_VISIBLE_DEVICES=0,1 $run --devices 0,1"
        fi
        python3 tools/h2d_bound.py --file "$WORK/h2d.bin"
        python3 -m cnnlab bench --rows startup,gpus --repeats 5
      } 2>&1 | tee "$OUT/gpus.log" || status=1 ;;
    startup)
      for run in 1 2 3; do
        for mode in cpu cuda; do
          timed "$mode default data, run $run" python3 -m cnnlab $mode --timing-json "$WORK/startup.json" >/dev/null
          python3 -c "import json, sys; print('  start-up', json.load(open(sys.argv[1]))['startup_seconds'])" "$WORK/startup.json"
        done
      done 2>&1 | tee "$OUT/startup.log" || status=1
      python3 -X importtime -c "import pycuda.driver as d; d.init()" 2>&1 | sort -t'|' -k2 -n | tail -5 | tee -a "$OUT/startup.log" ;;
    npy)
      cnnlab generate --images 1 --out-dir "$WORK/npy"
      random_npy "$WORK/npy/in.npy" 65536
      cat "$WORK/npy/in.npy" > /dev/null  # in the page cache
      for run in 1 2 3; do
        timed "cuda npy run $run" python3 -m cnnlab cuda "$WORK/npy/cnn.csv" "$WORK/npy/in.npy" "$WORK/npy/out.npy" --timing-json "$OUT/npy_$run.json"
        python3 -c "import json, sys; f = json.load(open(sys.argv[1])); print('loop', f['loop_seconds'], 's,', round(f['loop_images_per_second']), 'images/s; compute', f['work_seconds'], 's')" "$OUT/npy_$run.json"
      done 2>&1 | tee "$OUT/npy.log" || status=1
      rm -rf "$WORK/npy" ;;
    memory)
      cnnlab generate --images 2000 --out-dir "$WORK/mem"
      (echo 20000; for _ in $(seq 10); do tail -n +2 "$WORK/mem/in.csv"; done) > "$WORK/mem/in20k.csv"
      cnnlab convert "$WORK/mem/in.csv" "$WORK/mem/in.npy"
      random_npy "$WORK/mem/in20k.npy" 20000
      for mode in cpu cuda; do
        for input in in.csv in20k.csv in.npy in20k.npy; do
          timed "$mode $input" python3 -m cnnlab $mode "$WORK/mem/cnn.csv" "$WORK/mem/$input" "$WORK/mem/out.csv" >/dev/null
        done
      done 2>&1 | tee "$OUT/memory.log" || status=1
      rm -rf "$WORK/mem" ;;
    failrate)
      cnnlab generate --images 1 --out-dir "$WORK/fail"
      random_npy "$WORK/fail/in.npy" 100000
      for mode in cpu cuda; do
        timed "$mode" python3 -m cnnlab $mode "$WORK/fail/cnn.csv" "$WORK/fail/in.npy" "$WORK/fail/out_$mode.npy"
      done 2>&1 | tee "$OUT/failrate.log"
      cnnlab compare "$WORK/fail/out_cpu.npy" "$WORK/fail/out_cuda.npy" 2>&1 | tee -a "$OUT/failrate.log"
      rm -rf "$WORK/fail" ;;
    crossover)
      for images in 4 30 100 300 1000 3000; do
        cnnlab generate --images $images --out-dir "$WORK/cross" >/dev/null
        for mode in cpu cuda; do
          for run in 1 2 3; do
            /usr/bin/time -f "%e" -o "$WORK/cross/t_${mode}_$run" python3 -m cnnlab $mode "$WORK/cross/cnn.csv" "$WORK/cross/in.csv" "$WORK/cross/out.csv" >/dev/null
          done
          echo "$images images, $mode: wall $(cat "$WORK/cross/t_${mode}_"* | sort -n | tr '\n' ' ')s (3 runs)"
        done
      done 2>&1 | tee "$OUT/crossover.log" || status=1
      rm -rf "$WORK/cross" ;;
    parsers)
      python3 tools/bench_lab_csv.py --images 1000 --dir "$WORK/parsers" --threads 1 2 4 8 16 2>&1 | tee "$OUT/parsers.log" || status=1
      python3 tools/bench_csv_gpu.py "$WORK/parsers/in.csv" 2>&1 | tee -a "$OUT/parsers.log" || status=1
      cnnlab generate --images 2000 --seed 459 --out-dir "$WORK/parsers2k" >/dev/null
      python3 tools/profile_cpu_csv.py "$WORK/parsers2k/in.csv" --threads 1 2 4 8 16 2>&1 | tee -a "$OUT/parsers.log" || status=1
      rm -rf "$WORK/parsers" "$WORK/parsers2k" ;;
    two)
      python3 tools/ladder_sweep.py two 2>&1 | tee "$OUT/two.log" || status=1 ;;
    dask)
      {
        python3 -m pytest -q -rs -p no:cacheprovider tests/test_dask.py
        python3 tools/bench_dask.py
      } 2>&1 | tee "$OUT/dask.log" || status=1 ;;
    tune)
      cnnlab generate --images 2000 --seed 459 --out-dir "$WORK/tune" >/dev/null
      python3 tools/profile_cpu_csv.py "$WORK/tune/in.csv" --threads 1 $(nproc) --ahead-share 1 2 4 8 --step 16 32 64 2>&1 | tee "$OUT/tune.log" || status=1
      rm -rf "$WORK/tune" ;;
    profile)
      {
        for run in 1 2 3; do  # the driver's own start (the floor) is bench's startup row, below
          timed "python3 -S -c pass" python3 -S -c pass
          timed "python3 -c 'import numpy'" python3 -c "import numpy"
        done
        for mode in cuda cuda cpu; do
          echo "-- $mode, the default data"
          python3 tools/profile_startup.py $mode >/dev/null
        done
        cnnlab bench --rows startup --repeats 7
      } 2>&1 | tee "$OUT/profile.log" || status=1 ;;
    cpu)
      for threads in $(nproc) 1; do
        cnnlab bench --rows cpu,reader --threads "$threads" --json "$OUT/cpu_$threads.json" 2>&1 | tee -a "$OUT/cpu.log" || status=1
      done ;;
    parser)
      {
        lscpu | grep -E "Model name|Flags" | cut -c1-160
        python3 tools/bench_parser.py --dir "$WORK/parser" --images 2000 --core 0 --threads 1 2 4 8 16 --pairs 7
        cnnlab bench --rows reader --repeats 3  # the ~1 GB file: the reader against from_chars, one thread and every one
        cnnlab generate --images 10000 --seed 459 --out-dir "$WORK/parser"
        (echo 30000; for _ in 1 2 3; do tail -n +2 "$WORK/parser/in.csv"; done) > "$WORK/parser/in30k.csv"
        cat "$WORK/parser/in30k.csv" > /dev/null  # in the page cache
        ls -l "$WORK/parser/in30k.csv"
        for run in 1 2 3; do
          timed "cpu, 30,000 CSV images, run $run" python3 -m cnnlab cpu "$WORK/parser/cnn.csv" "$WORK/parser/in30k.csv" \
            "$WORK/parser/out.csv" --timing-json "$OUT/parser_job_$run.json"
          python3 -c "import json, sys; f = json.load(open(sys.argv[1])); print('  loop', round(f['loop_seconds'], 3), 's; start-up', f['startup_seconds'])" "$OUT/parser_job_$run.json"
        done
      } 2>&1 | tee "$OUT/parser.log" || status=1
      rm -rf "$WORK/parser" ;;
    cpujob)
      job30k
      {
        ls -l "$WORK/job/in30k.csv"
        for run in 1 2 3; do
          timed "cpu, 30,000 CSV images, run $run" python3 -m cnnlab cpu "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/job/out_cpu.csv" \
            --timing-json "$OUT/job_cpu_$run.json"
          python3 -c "import json, sys; f = json.load(open(sys.argv[1])); print('  loop', round(f['loop_seconds'], 3), 's; start-up', f['startup_seconds'], '; work', round(f['work_seconds'], 3))" "$OUT/job_cpu_$run.json"
        done
        for run in 1 2; do
          timed "cuda, 30,000 CSV images, run $run" python3 -m cnnlab cuda "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/job/out_cuda.csv"
        done
        echo "-- cpu, 30,000 CSV images, phase by phase"
        python3 tools/profile_startup.py cpu "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/job/out_cpu.csv" >/dev/null
        echo "-- cuda, 30,000 CSV images, phase by phase"
        python3 tools/profile_startup.py cuda "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/job/out_cuda.csv" >/dev/null
        cnnlab compare "$WORK/job/out_cpu.csv" "$WORK/job/out_cuda.csv"
      } 2>&1 | tee "$OUT/cpujob.log" || status=1 ;;
    trace)
      job30k
      {
        for mode_runs in "cuda 60" "cpu 30"; do
          set -- $mode_runs; mode=$1
          python3 tools/trace_overhead.py $mode "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" --runs $2 --trace "$OUT/trace-$mode.json.gz"
          cnnlab trace-plot "$OUT/trace-$mode.json.gz" "$OUT/trace-$mode.png"
        done
        cnnlab cuda "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/job/out.csv" --trace "$OUT/trace-cuda-chunks.json.gz" --trace-chunks
        cnnlab trace-plot "$OUT/trace-cuda-chunks.json.gz" "$OUT/trace-cuda-chunks.png"
        python3 -m pytest -q -rs -p no:cacheprovider tests/test_trace.py
      } 2>&1 | tee "$OUT/trace.log" || status=1 ;;
    sweep)
      for config in "512 3" "2048 3" "512 3" "2048 3" "1024 3" "2048 4"; do
        set -- $config
        echo "chunk $1, streams $2"
        cnnlab bench --rows pinned,bounds --chunk-images "$1" --streams "$2" --repeats 9
      done 2>&1 | tee "$OUT/sweep.log" || status=1 ;;
    api)
      python3 -m pytest -q -rs -p no:cacheprovider tests/test_api.py tests/test_api_gpu.py 2>&1 | tee "$OUT/api.log" || status=1
      python3 - <<'PY' 2>&1 | tee -a "$OUT/api.log" || status=1
import time, numpy as np, torch, cnnlab
from cnnlab.network import Cnn, ImageBatch
rng = np.random.default_rng()
cnn = Cnn(rng.uniform(-10, 10, (10, 5, 5)), rng.uniform(-10, 10, (10, 4000)))
images = torch.from_numpy(rng.uniform(-10, 10, (65536, 100, 100))).cuda()
out = torch.empty((65536, 10), dtype=torch.float64, device="cuda")
with cnnlab.CudaContext(cnn) as gpu:
    resident = gpu.upload(ImageBatch(images.cpu().numpy()))
    for name, run in (("forward(tensor, out=tensor)", lambda: gpu.forward(images, out=out)),
                      ("forward(tensor) to numpy", lambda: gpu.forward(images)),
                      ("compute_resident (bench's resident row)", lambda: gpu.compute_resident(resident))):
        run()
        times = []
        for _ in range(7):
            start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
        print(f"{name}: {65536 / sorted(times)[3]:,.0f} images/s (median of 7, 65,536 images)")
    assert (out.cpu().numpy().view(np.uint64) == gpu.forward(images).view(np.uint64)).all()
PY
      rm -rf "$WORK/wheel" && mkdir -p "$WORK/wheel"
      {
        python3 -m pip wheel . --no-deps --no-build-isolation -w "$WORK/wheel/dist" 2>&1 | tail -2
        python3 -m zipfile -l "$WORK/wheel/dist"/cnnlab-*.whl | grep -E "fatbin|_lab_csv|py.typed"
        python3 -m venv --without-pip "$WORK/wheel/venv"  # this machine's pip installs into it (--python)
        env -u PYTHONPATH python3 -m pip --python "$WORK/wheel/venv/bin/python" install -q --no-index --no-deps \
          "$WORK/wheel/dist"/cnnlab-*.whl .wheelhouse/*.whl .venvwheels/*.whl
        cd "$WORK/wheel"
        # Only the environment's own bin on the PATH: no nvcc, and no checkout on the import path.
        bare() { env -u PYTHONPATH PATH="$WORK/wheel/venv/bin" "$@"; }
        bare python -c "import shutil, cnnlab; print('nvcc:', shutil.which('nvcc'), '| cnnlab from', cnnlab.__file__)"
        bare cnnlab --version && bare cnnlab cuda && bare cnnlab cpu && bare cnnlab compare out/out.csv out/out_cuda.csv
        cd - >/dev/null
      } 2>&1 | tee "$OUT/wheel.log" || status=1
      grep -q "Comparison finished" "$OUT/wheel.log" || status=1
      rm -rf "$WORK/wheel" ;;
    against)
      if [ -z "${BEFORE:-}" ]; then echo "against: BEFORE names no checkout"; status=1; continue; fi
      (cd "$BEFORE" && python3 setup.py -q build_ext --inplace 2>&1 | tail -3 && python3 build.py --no-ladder) || { status=1; continue; }
      job30k
      npy200k
      {
        against() { SITE=/tmp/site python3 tools/against.py --before "$BEFORE" "$@"; }
        against --pairs 15 --label "default data" cuda data/cnn.csv data/in.csv
        against --pairs 5 --label "30,000 CSV images" cuda "$WORK/job/cnn.csv" "$WORK/job/in30k.csv"
        against --pairs 5 --label "200,000 .npy images" cuda "$WORK/job/cnn.csv" "$WORK/job/in200k.npy"
      } 2>&1 | tee "$OUT/against.log" || status=1 ;;
    sizes)
      job3k; job30k; npy200k
      {
        sampled() {  # sampled LABEL COMMAND...: the command's loop seconds and the GPU's peak memory above the level before
          local before; before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0)
          nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 20 > "$WORK/memory.log" & local sampler=$!
          "${@:2}" --timing-json "$WORK/sizes.json" > /dev/null
          kill $sampler; wait $sampler 2>/dev/null
          python3 -c "import json, sys; f = json.load(open(sys.argv[1])); peak = max(map(int, open(sys.argv[2]).read().split() or [0]))
print(f'{sys.argv[3]:<44} loop {f[\"loop_seconds\"]:.3f} s, start-up {f[\"startup_seconds\"]:.3f} s, peak GPU memory {peak - int(sys.argv[4]):,} MiB above the level before')" \
            "$WORK/sizes.json" "$WORK/memory.log" "$1" "$before"
        }
        for turn in $(seq "${TURNS:-5}"); do
          for text in ${TEXT_SIZES:-64M 128M 192M 256M 512M}; do
            sampled "30,000 CSV, TEXT_BUFFER_BYTES=$text" python3 tools/with_sizes.py TEXT_BUFFER_BYTES=$text -- cuda "$WORK/job/cnn.csv" "$WORK/job/in30k.csv" "$WORK/sizes.csv"
          done
          for images in ${IMAGE_SIZES:-2048 4096 6144 8192 16384}; do
            sampled "200,000 .npy, DEFAULT_BUFFER_IMAGES=$images" python3 tools/with_sizes.py DEFAULT_BUFFER_IMAGES=$images -- cuda "$WORK/job/cnn.csv" "$WORK/job/in200k.npy" "$WORK/sizes.npy"
          done
        done
        for input in data/in.csv "$WORK/job/in3k.csv"; do sampled "$(basename "$input"), as committed" cnnlab cuda data/cnn.csv "$input" "$WORK/sizes.csv"; done
      } 2>&1 | tee "$OUT/sizes.log" || status=1 ;;
    csvwalls)
      job30k
      [ -f "$WORK/job15k/in.csv" ] || cnnlab generate --images 15000 --seed 15 --out-dir "$WORK/job15k"
      cat "$WORK/job15k/in.csv" > /dev/null
      for input in "$WORK/job/in.csv" "$WORK/job15k/in.csv" "$WORK/job/in30k.csv"; do
        echo "-- $(head -n 1 "$input") CSV images: A cuda, B cpu"
        python3 tools/paired_wall.py --pairs 5 --settle 0.5 --a "python3 -m cnnlab cuda $WORK/job/cnn.csv $input $WORK/walls.csv" \
          --b "python3 -m cnnlab cpu $WORK/job/cnn.csv $input $WORK/walls.csv"
      done 2>&1 | tee "$OUT/csvwalls.log" || status=1 ;;
    account)
      job3k; npy200k
      {
        for input in data/in.csv "$WORK/job/in3k.csv" "$WORK/job/in30k.csv" "$WORK/job/in200k.npy"; do
          python3 tools/gpu_memory.py cuda data/cnn.csv "$input" "$WORK/account.${input##*.}"
        done
        shared() {  # shared FREE_MB INPUT: the run with another process holding all of the GPU's memory but FREE_MB
          local extension=${2##*.}
          coproc holder { python3 tests/gpu_memory_holder.py "$1"; }
          local left; read -r left <&"${holder[0]}"
          rm -f "$WORK/shared.$extension"
          cnnlab cuda data/cnn.csv "$2" "$WORK/shared.$extension" 2> "$WORK/shared.err"; local code=$?
          exec {holder[1]}>&-; wait $holder_PID 2>/dev/null
          echo "$1 MB free ($left bytes left by the holder), $(basename "$2"): status $code, $(wc -l < "$WORK/shared.err") stderr lines, output $([ -f "$WORK/shared.$extension" ] && echo written || echo none)"
          sed 's/^/    stderr: /' "$WORK/shared.err"
          [ $code = 0 ] && cnnlab compare "$WORK/shared.$extension" "$WORK/cpu.$extension"
        }
        for input in "$WORK/job/in3k.csv" "$WORK/job/in30k.csv" "$WORK/job/in200k.npy"; do
          cnnlab cpu data/cnn.csv "$input" "$WORK/cpu.${input##*.}"
          for free in 1000 700 300; do shared $free "$input"; done
        done
      } 2>&1 | tee "$OUT/account.log" || status=1 ;;
    long)
      cnnlab generate --images 1 --out-dir "$WORK/long"
      random_npy "$WORK/long/in.npy" 200000
      timed "cuda, 200,000 images" python3 -m cnnlab cuda "$WORK/long/cnn.csv" "$WORK/long/in.npy" "$WORK/long/out.npy" \
        --timing-json "$OUT/long.json" 2>&1 | tee "$OUT/long.log" || status=1
      cat "$OUT/long.json" | tee -a "$OUT/long.log"
      rm -rf "$WORK/long" ;;
  esac
done
exit $status
