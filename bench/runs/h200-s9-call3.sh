# Session 9, H200 call 3 (one nvidia-h200, inside 10 minutes): namespaced sandboxes on the GPU box
# (issue 20: doctor, the GPU sandbox tests, tests/adversarial -m gpu, kernelab check's wall with
# and without isolation), and the CUDA C++ candidate gated and timed (issue 17: bench/cuda/run.py).
# Run as root; sandboxes drop to nobody, who must be able to read the tree and the packages.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s3; mkdir -p $R/iso $R/cuda
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee $R/gpu.txt
{ id; uname -r; unshare --version; cat /proc/sys/user/max_user_namespaces; } > $R/box.txt 2>&1
timeout 60 python3 -m kernelabd doctor --json --home /tmp/doctor-home > $R/doctor.json 2>$R/doctor.err
python3 -c "import json,sys; [print(c['name'], c['status'], c['detail'][:200]) for c in json.load(open(sys.argv[1]))['checks'] if c['name'] in ('isolation','sandbox-memory','gpus')]" $R/doctor.json | tee $R/doctor.txt
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/harness/test_sandbox.py tests/harness/test_containment.py tests/harness/test_isolation.py tests/harness/test_shared.py tests/harness/test_session.py 2>&1 | tail -8 | tee $R/gpu-sandbox-tests.txt
timeout 230 python3 -m pytest -q -p no:cacheprovider -m gpu -n 8 tests/adversarial 2>&1 | tail -15 | tee $R/adversarial-gpu.txt
timeout 150 python3 bench/isolation/check_cost.py $R/iso --device cuda --runs 1 > $R/iso/check-cost.log 2>&1; tail -8 $R/iso/check-cost.log
timeout 110 python3 bench/cuda/run.py --out $R/cuda > $R/cuda/log.txt 2>&1; echo "cuda rc=$?"; tail -12 $R/cuda/log.txt
cd $OUT && tar czf s3.tgz s3 && rm -rf s3
