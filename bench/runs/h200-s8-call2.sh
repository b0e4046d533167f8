# Session 8, H200 call 2: the job-long reference session on a GPU for the first time.
# GPU tests of the shared arenas, the CUDA target and capture; kernelab check of the examples;
# kernelab inspect of KernelBench level 1's five largest problems at their own sizes.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export PYTHONUNBUFFERED=1
mkdir -p $OUT/s2
nvidia-smi --query-gpu=name,clocks.sm,memory.used --format=csv,noheader
timeout 240 python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/harness/test_shared.py tests/harness/test_cuda_target.py tests/service/test_capture.py 2>&1 | tail -6 | tee $OUT/s2/gpu-tests.txt
for ex in softmax layernorm gelu_gate matmul; do
  s=$(date +%s.%N); timeout 150 python3 -m kernelabd check examples/$ex.py examples/$ex.new.py --device cuda --json > $OUT/s2/check-$ex.json 2>$OUT/s2/check-$ex.err; rc=$?; e=$(date +%s.%N)
  python3 -c "import json,sys; d=json.load(open('$OUT/s2/check-$ex.json')); print('$ex', 'rc=$rc', 'wall=%.1f' % ($e-$s), d['verdict'], d['rule'], d.get('speedup'), d.get('stages'), (d.get('reason') or '')[:200])" || tail -3 $OUT/s2/check-$ex.err
done | tee $OUT/s2/checks.txt
K=bench/coverage/kernelbench/level1
for p in 23_Softmax 47_Sum_reduction_over_a_dimension 97_ScaledDotProductAttention 63_conv_standard_2D__square_input__square_kernel 36_RMSNorm_; do
  s=$(date +%s.%N); timeout 200 python3 -m kernelabd inspect $K/$p.py --device cuda --json --home /tmp/home > $OUT/s2/inspect-$p.json 2>$OUT/s2/inspect-$p.err; rc=$?; e=$(date +%s.%N)
  python3 -c "
import json; d=json.load(open('$OUT/s2/inspect-$p.json')); m=d.get('memory') or {}; pl=d.get('plan') or {}; G=2**30
print('$p'[:28], 'rc=$rc', 'wall=%.1f' % ($e-$s), d['outcome'], 'trusted=%.2fG' % (m.get('trusted_rss_peak_bytes',0)/G), 'ref_rss=%.2fG' % ((m.get('reference_rss_peak_bytes') or 0)/G), 'ref_dev=%.1fG' % ((m.get('reference_device_peak_bytes') or 0)/G), 'arena=%.1fG' % ((m.get('reference_arena_bytes') or 0)/G), 'plan', pl.get('gate_sets'), pl.get('timing_sets'), pl.get('oracle_chunks'), 'needs=%.1fG' % ((pl.get('needs_device_bytes') or 0)/G), 'sol=', (d.get('speed_of_light') or {}).get('ms'), (d.get('reason') or '')[:160])" || tail -3 $OUT/s2/inspect-$p.err
done | tee $OUT/s2/inspect.txt
cd $OUT && tar czf s2.tgz s2 && rm -rf s2
