# Session 15, H200 call 3: issue 14's 1-GPU-minute bench/port rows for the two problems that
# session 14's calls cut short (rmsnorm_llama after 0.26 GPU-minutes, sdpa after 0.17), each
# given its minute, with the jobs' own torch.compile peers.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c3; mkdir -p $R/g
timeout ${LIMIT_S:-560} python3 bench/port/run.py --only ${PROBLEMS:-rmsnorm_llama sdpa} --minutes 1 --no-compile --deadline-s $(( ${LIMIT_S:-560} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c3.tgz c3 && cp c3/g/results.jsonl c3.jsonl; cp c3/g/log.txt c3-log.txt; rm -rf c3
