# Session 7, H200 call 2: the CUDA C++ example gated and timed (bench/cuda/run.py) and the CUDA GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
python3 -c "import cuda.core, cuda.bindings; print('cuda.core', cuda.core.__version__)"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/harness/test_cuda_target.py 2>&1 | tail -5
timeout 420 python3 bench/cuda/run.py --out $OUT/cuda 2>$OUT/cuda-stderr.txt; echo "run.py exit $?"
cd $OUT && tar czf cuda-results.tgz cuda cuda-stderr.txt && rm -rf cuda
