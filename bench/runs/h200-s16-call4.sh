# Session 16, H200 call 4 (the session's last device time): the new direct (depthwise-like)
# convolution template. Its seeds against eager at KernelBench level 1's own sizes (#82-#85:
# depthwise 2-D, square and asymmetric kernels and inputs), two block variants; then #82 ported
# at 1 GPU-minute with the job's own torch.compile peers.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c4; mkdir -p $R/s1 $R/g
KB=bench/coverage/kernelbench
L1="$(cd $KB/level1 && ls 82_* 83_* 84_* 85_* | sed 's/\.py$//' | tr '\n' ' ')"
timeout ${SEEDS_S:-100} python3 bench/port/seeds.py --problems $KB/level1 --only $L1 --variant b1024:BLOCK=1024 b2048w8:BLOCK=2048,num_warps=8 --out $R/s1 > $R/s1/log.txt 2>&1; echo "s1 rc=$?"
timeout ${PORT_S:-230} python3 bench/port/run.py --problems $KB/level1 --only 82_conv_depthwise_2D_square_input_square_kernel --minutes 1 --no-compile --deadline-s $(( ${PORT_S:-230} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"
[ -f $R/s1/seeds.md ] && grep "^| " $R/s1/seeds.md | cut -c1-60,100-220 || tail -5 $R/s1/log.txt
grep "^| \|^- .*own timing" $R/g/table.md | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c4.tgz c4 && cp c4/g/results.jsonl c4.jsonl; rm -rf c4
