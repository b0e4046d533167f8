set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
git log --oneline -1
export PYTHONUNBUFFERED=1
( timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/adversarial tests/service tests/propose tests/harness -x 2>&1 | tail -15 ) | tee $OUT/gpu-tests.log
for ex in softmax layernorm gelu_gate matmul; do for i in 1 2 3; do
  s=$(date +%s.%N); python3 -m kernelabd check examples/$ex.py examples/$ex.new.py --device cuda --json > $OUT/check-$ex-$i.json 2>>$OUT/check.err; rc=$?; e=$(date +%s.%N)
  echo "$ex run$i rc=$rc wall=$(python3 -c "print(round($e-$s,2))") verdict=$(python3 -c "import json;d=json.load(open('$OUT/check-$ex-$i.json'));print(d['verdict'],d.get('speedup'))")"
done; done | tee $OUT/check-walls.txt
