unset PYTHONDONTWRITEBYTECODE; export PYTHONPYCACHEPREFIX=/tmp/pyc
python3 -m pip install -q --no-index --no-deps --target /tmp/site .wheelhouse/*.whl; export PYTHONPATH=/tmp/site:$PWD
python3 setup.py -q build_ext --inplace >/dev/null 2>&1; python3 build.py --no-ladder >/dev/null || echo BUILD FAILED
nvidia-smi -L
timeout 100 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_multi_gpu.py tests/test_image_buffer.py 2>&1 | tail -3
python3 -c "
import numpy as np; rng = np.random.default_rng()
out = np.lib.format.open_memmap('/tmp/in.npy', 'w+', np.float64, (40000, 100, 100))
for s in range(0, 40000, 4096): out[s:s + 4096] = rng.uniform(-10, 10, (min(4096, 40000 - s), 100, 100))
out.flush()"
cat /tmp/in.npy > /dev/null
python3 -m cnnlab cuda data/cnn.csv /tmp/in.npy /tmp/o1.npy; python3 -m cnnlab cuda data/cnn.csv /tmp/in.npy /tmp/o2.npy --devices 0,1; python3 -m cnnlab cpu data/cnn.csv /tmp/in.npy /tmp/oc.npy
python3 -c "import numpy as np; a,b,c=(np.load(f'/tmp/{n}.npy') for n in ('o1','o2','oc')); print('1 GPU == 2 GPUs bytes:', a.tobytes()==b.tobytes(), '; max rel diff to cpu', float(np.max(np.abs(a-c)/np.maximum(np.abs(c),1e-300))))"
echo "40,000 .npy images: A --devices 0,1, B GPU 0"
timeout 60 python3 tools/paired_wall.py --pairs 5 --settle 0.5 --a "python3 -m cnnlab cuda data/cnn.csv /tmp/in.npy /tmp/w.npy --devices 0,1" --b "python3 -m cnnlab cuda data/cnn.csv /tmp/in.npy /tmp/w.npy"
