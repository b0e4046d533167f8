# Session 9, H200 call 4 (one nvidia-h200, inside 10 minutes): kernelab check's wall with and
# without namespaced sandboxes (issue 20, bench/isolation/check_cost.py), the CUDA C++ candidate
# gated and timed (issue 17, bench/cuda/run.py), then full ports of KernelBench level 1's largest
# problems at their own sizes (issue 13) until the deadline.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s4; mkdir -p $R/iso $R/cuda $R/ports
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,memory.used --format=csv,noheader | tee $R/gpu.txt
timeout 170 python3 bench/isolation/check_cost.py $R/iso --device cuda --runs 1 > $R/iso/check-cost.log 2>&1; tail -7 $R/iso/check-cost.log
timeout 130 python3 bench/cuda/run.py --out $R/cuda > $R/cuda/log.txt 2>&1; echo "cuda rc=$?"; tail -10 $R/cuda/log.txt
timeout 250 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 23_Softmax 36_RMSNorm_ 47_Sum_reduction_over_a_dimension --minutes 0.5 --no-compile --deadline-s 230 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; tail -8 $R/ports/log.txt; cat $R/ports/table.md 2>/dev/null | head -12
cd $OUT && tar czf s4.tgz s4 && rm -rf s4
