# Session 12, H200 call 2: issue 14's 1-GPU-minute bench/port table, groups g2-g4 (six of the
# 13 problems of the committed 2-minute table, bench/port/results/2026-11-30-h200-s6-final);
# torch.compile is timed by each job itself (report.json "peers"), not by the benchmark.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s2; mkdir -p $R/g
timeout 560 python3 bench/port/run.py --group g2 g3 g4 --minutes 1 --no-compile --deadline-s 550 --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
rm -rf $R/g/home/tmp 2>/dev/null
cd $OUT && tar czf s2.tgz s2 && cp s2/g/results.jsonl g2-4.jsonl; rm -rf s2
