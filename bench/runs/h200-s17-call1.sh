# PLANNED, NOT YET RUN: session 17 was lent no GPU; run it as is in a later session.
# Template pipelines (a convolution or matmul with its epilogue, then a softmax, norm, reduction
# or pooling, then what follows) on the KernelBench level 2 problems that they newly match
# (GroupNorm, pooling, min and logsumexp among them), and level 1's GroupNorm and pooling
# problems, at KernelBench's own sizes: every seed against eager (its output compared), then
# ports of PORT_IDS at 1 GPU-minute each, with the jobs' own torch.compile peers (default and
# max-autotune) as "x best peer".
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c1; mkdir -p $R/s1 $R/g
KB=bench/coverage/kernelbench/level2
pick() { (cd $KB && for n in "$@"; do ls ${n}_*.py; done | sed 's/\.py$//' | tr '\n' ' '); }
SEEDS="$(pick ${SEED_IDS:-13 17 19 25 35 46 49 55 61 64 67 91 93})"
PORTS="$(pick ${PORT_IDS:-91 17})"
timeout ${SEEDS_S:-170} python3 bench/port/seeds.py --problems $KB --only $SEEDS --out $R/s1 > $R/s1/log.txt 2>&1; echo "s1 rc=$?"
mkdir -p $R/s2; L1="$(cd $KB/../level1 && ls 35_* 41_* 42_* 43_* 44_* 45_* 46_* | sed 's/\.py$//' | tr '\n' ' ')"
timeout ${SEEDS1_S:-80} python3 bench/port/seeds.py --problems $KB/../level1 --only $L1 --out $R/s2 > $R/s2/log.txt 2>&1; echo "s2 rc=$?"
timeout ${PORT_S:-290} python3 bench/port/run.py --problems $KB --only $PORTS --minutes 1 --no-compile --deadline-s $(( ${PORT_S:-290} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"
for s in s1 s2; do [ -f $R/$s/seeds.md ] && grep "^| " $R/$s/seeds.md | cut -c1-70,100-240 || tail -5 $R/$s/log.txt; done
grep "^| \|^- .*own timing" $R/g/table.md | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c1.tgz c1 && cp c1/g/results.jsonl c1.jsonl; cp c1/s1/seeds.jsonl c1-seeds.jsonl; cp c1/s2/seeds.jsonl c1-seeds-l1.jsonl; rm -rf c1
