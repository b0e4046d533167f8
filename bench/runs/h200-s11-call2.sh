# Session 11, H200 call 2: the sweep's last 14 problems (issue 13), then the full port of
# KernelBench level 1's 63_conv at its own size (issue 13's five; session 10's port ran out of
# its budget before the first candidate, when peers were timed before it).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
python3 -c "import textual, optuna, sqlite_utils, httpx, pyseccomp" || exit 1
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s2; mkdir -p $R/ports
timeout 300 python3 bench/kernelbench/sweep.py --out $R/sweep --device cuda --parallel 2 --deadline-s 260 --timeout-s 75 \
    --skip bench/kernelbench/results/2026-12-02-h200-s10/rows*.jsonl bench/kernelbench/results/2026-12-02-h200-s11/rows-call1.jsonl 2>&1 | tee $R/sweep.log | tail -n 18
cp $R/sweep/rows.jsonl $OUT/rows-s11-call2.jsonl
timeout 250 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 2 --no-compile --deadline-s 60 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; tail -5 $R/ports/log.txt; cat $R/ports/table.md 2>/dev/null | head -8
rm -rf $R/sweep/home $R/ports/home/tmp 2>/dev/null
cd $OUT && tar czf s2.tgz s2 && rm -rf s2
