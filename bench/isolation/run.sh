# Sandbox isolation on the H200 (issue 20), one command per stage, each inside 10 minutes:
#
#   bash bench/isolation/run.sh $OUT tests         # what this box gives (doctor), the fence and GPU sandbox tests (~3 min)
#   bash bench/isolation/run.sh $OUT cost          # kernelab check with and without namespaces, interleaved (~6 min)
#   bash bench/isolation/run.sh $OUT adversarial   # tests/adversarial -m gpu with namespaced sandboxes (~9 min)
#
# Every stage writes box.txt and doctor.json under $OUT; `tests` adds sandbox-tests.log, `cost`
# check-cost.log and check_cost.py's raw files, its last lines the table (goal: at most +1 s a
# check). Compare with results/2026-12-01-h200-baseline.txt (session 7, before isolation).
set -o pipefail
OUT=${1:?usage: run.sh OUT tests|cost|adversarial}
STAGE=${2:-tests}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || exit
# Run as root, sandboxes drop to nobody, who must be able to read the tree and the packages.
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
git log --oneline -1
{ id; uname -r; command -v unshare bwrap; unshare --version; python3 -c "import pyseccomp; print('pyseccomp ok')"
  cat /proc/sys/user/max_user_namespaces /proc/self/cgroup; } 2>&1 | tee "$OUT/box.txt"
python3 -m kernelabd doctor --json --home "$OUT/doctor-home" > "$OUT/doctor.json"
python3 -c "import json,sys; [print(c['name'], c['status'], c['detail']) for c in json.load(open(sys.argv[1]))['checks']
            if c['name'] in ('isolation', 'sandbox-memory', 'gpus')]" "$OUT/doctor.json"
case "$STAGE" in
adversarial)
  timeout 560 python3 -m pytest -q -p no:cacheprovider -m gpu tests/adversarial 2>&1 | tail -20 | tee "$OUT/adversarial-gpu.log" ;;
cost)
  timeout 540 python3 bench/isolation/check_cost.py "$OUT" --device cuda --runs 2 2>&1 | tee "$OUT/check-cost.log" ;;
*)
  # The fence probed from inside on this kernel (CPU sandboxes), the GPU sandbox (a Triton kernel,
  # NVML, a host memory limit under CUDA), and a cgroup limit where root may make one.
  timeout 500 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/harness/test_sandbox.py \
    tests/harness/test_containment.py tests/harness/test_isolation.py 2>&1 | tail -20 | tee "$OUT/sandbox-tests.log" ;;
esac
