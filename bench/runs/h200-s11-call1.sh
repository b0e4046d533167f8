# Session 11, H200 call 1 (one nvidia-h200, inside 10 minutes): the 49 KernelBench problems that
# session 10's sweep did not reach (all of 2 GiB or more, so one at a time), at their own sizes
# through `kernelab inspect --device cuda` (issue 13); no problem starts after 500 s (the rest:
# call 2).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
python3 -c "import textual, optuna, sqlite_utils, httpx, pyseccomp" || exit 1
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s1; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv,noheader | tee $R/gpu.txt
free -g | tee -a $R/gpu.txt
timeout 580 python3 bench/kernelbench/sweep.py --out $R/sweep --device cuda --parallel 2 --deadline-s 500 --timeout-s 75 \
    --skip bench/kernelbench/results/2026-12-02-h200-s10/rows*.jsonl 2>&1 | tee $R/sweep.log | tail -n 40
rm -rf $R/sweep/home/tmp 2>/dev/null; du -sh $R/sweep/home
cp $R/sweep/rows.jsonl $OUT/rows-s11-call1.jsonl
cd $OUT && tar czf s1.tgz --exclude='s1/sweep/home' s1 && rm -rf s1
