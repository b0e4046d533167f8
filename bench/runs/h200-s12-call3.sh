# Session 12, H200 call 3: issue 14's 1-GPU-minute bench/port table, two memory-bound problems of
# the 13 of the committed 2-minute table (bench/port/results/2026-11-30-h200-s6-final);
# torch.compile is timed by each job itself (report.json "peers"), not by the benchmark.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s3; mkdir -p $R/g
timeout 345 python3 bench/port/run.py --only softmax layernorm --minutes 1 --no-compile --deadline-s 330 --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
rm -rf $R/g/home/tmp 2>/dev/null
cd $OUT && tar czf s3.tgz s3 && cp s3/g/results.jsonl g-mem.jsonl; rm -rf s3
