# Session 12, H200 call 1: the 63_conv port at KernelBench's own size with the float64 oracle
# chunked along the batch for margin and timing sets' oracles dropped after calibration (call 5
# of session 11 lost it to an 18 GiB re-check with 3.7 GiB free); then issue 14's 1-GPU-minute
# bench/port table, group g1 (the rest: calls 2 and 3).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s1; mkdir -p $R/conv $R/g
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 200 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 1.5 --no-compile --deadline-s 195 --out $R/conv > $R/conv/log.txt 2>&1; echo "conv rc=$?"; grep "^| 63" $R/conv/table.md | cut -c1-400
timeout 330 python3 bench/port/run.py --group g1 --minutes 1 --no-compile --deadline-s 320 --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
rm -rf $R/conv/home/tmp $R/g/home/tmp 2>/dev/null
cd $OUT && tar czf s1.tgz s1 && cp s1/conv/results.jsonl conv.jsonl; cp s1/g/results.jsonl g1.jsonl; rm -rf s1
