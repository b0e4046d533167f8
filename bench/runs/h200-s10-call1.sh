# Session 10, H200 call 1 (one nvidia-h200, inside 10 minutes): KernelBench levels 1 and 2 at
# their own sizes through `kernelab inspect --device cuda` (issue 13's sweep), large problems one
# at a time beside the small ones 7 at a time; no problem starts after 420 s (the rest: call 2).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv,noheader | tee $R/gpu.txt
free -g | tee -a $R/gpu.txt
timeout 575 python3 bench/kernelbench/sweep.py --out $R/sweep --device cuda --parallel 8 --deadline-s 420 --timeout-s 150 2>&1 | tee $R/sweep.log | tail -n 25
rm -rf $R/sweep/home/tmp 2>/dev/null; du -sh $R/sweep/home
cp $R/sweep/rows.jsonl $OUT/rows-call1.jsonl
cd $OUT && tar czf s1.tgz --exclude='s1/sweep/home' s1 && rm -rf s1
