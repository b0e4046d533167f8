# Session 10, H200 call 2 (one nvidia-h200, inside 10 minutes): full ports of the three
# KernelBench level-1 problems issue 13 names that no earlier session ported (36_RMSNorm_,
# 97_SDPA, 63_conv, at their own sizes, 0.5 GPU-minutes each), then issue 14's screening
# benchmark on three bench/port problems at 1 GPU-minute each (its first run on a GPU).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s2; mkdir -p $R/ports $R/screen
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee $R/gpu.txt
timeout 265 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 36_RMSNorm_ 97_ScaledDotProductAttention 63_conv_standard_2D__square_input__square_kernel --minutes 0.5 --no-compile --deadline-s 200 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; tail -5 $R/ports/log.txt; cat $R/ports/table.md 2>/dev/null | head -8
timeout 300 python3 bench/screen/run.py --out $R/screen --minutes 1 --only softmax layernorm matmul_square --timeout-s 140 > $R/screen/log.txt 2>&1; echo "screen rc=$?"; tail -25 $R/screen/log.txt
cd $OUT && tar czf s2.tgz s2 && rm -rf s2
