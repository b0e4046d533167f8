# PLANNED, NOT YET RUN: session 17 was lent no GPU; run it as is in a later session.
# Issue 15's bench/port problems that have never been ported on the GPU (g8-g13: bf16/fp16
# GEMMs with epilogues, casts, odd widths, wide rows, a non-last-dim mean, attention variants),
# 1 GPU-minute each, with the jobs' own torch.compile peers. PROBLEMS picks the call's problems
# (about three fit one 10-minute call); the runner starts none it cannot finish before the
# deadline. CALL names the call's folder.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
C=${CALL:-c2}; R=$OUT/$C; mkdir -p $R/g
timeout ${LIMIT_S:-560} python3 bench/port/run.py --only ${PROBLEMS:?} --minutes 1 --no-compile --deadline-s $(( ${LIMIT_S:-560} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf $C.tgz $C && cp $C/g/results.jsonl $C.jsonl; cp $C/g/log.txt $C-log.txt; rm -rf $C
