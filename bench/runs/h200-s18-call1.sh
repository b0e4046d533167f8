# Session 18, H200 call 1: the Inductor ports now time kernels specialised to the timed shape (as
# torch.compile's are), a dynamic-shape or per-shape copy serving the gate's other shapes. The
# three bench/port rows that lost to the jobs' torch.compile peers at 1 GPU-minute (layernorm
# 0.880x, softmax 0.938x, rmsnorm_llama 0.881x), ported again at 1 GPU-minute each with the jobs'
# own peers (default and max-autotune).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
C=${CALL:-c1}; R=$OUT/$C; mkdir -p $R/g
timeout ${LIMIT_S:-560} python3 bench/port/run.py --only ${PROBLEMS:-layernorm softmax rmsnorm_llama} --minutes 1 --no-compile --deadline-s $(( ${LIMIT_S:-560} - 10 )) --reserve-s 30 --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| \|^- " $R/g/table.md | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf $C.tgz $C && cp $C/g/results.jsonl $C.jsonl; cp $C/g/log.txt $C-log.txt; rm -rf $C
