# Session 14, H200 call 3: issue 13's 63_conv port at KernelBench's own size, given the wall to
# end `done` (session 12's call stopped it `paused` after its first candidate, at 195 s).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c3; mkdir -p $R/conv
timeout ${CONV_S:-430} python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 1.5 --no-compile --deadline-s $(( ${CONV_S:-430} - 10 )) --out $R/conv > $R/conv/log.txt 2>&1; echo "conv rc=$?"; grep "^| 63" $R/conv/table.md | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c3.tgz c3 && cp c3/conv/results.jsonl c3.jsonl; cp c3/conv/log.txt c3-log.txt; rm -rf c3
