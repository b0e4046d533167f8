# Session 16, H200 call 2: the transposed convolution decomposed by phase (each program one output
# phase, K over that phase's taps only). First the template's seeds, against eager, at
# KernelBench's own sizes: its transposed convolutions of level 1 (strided, dilated, grouped and
# not) and level 2, and 3-D convolutions; then bench/port's strided ConvTranspose2d at 1 GPU-minute
# with the job's own torch.compile peers (call 1 measured the gather-every-tap kernel there).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c2; mkdir -p $R/s1 $R/s2 $R/g
KB=bench/coverage/kernelbench
V="k64:BLOCK_K=64 n128:BLOCK_N=128"
L1="$(cd $KB/level1 && ls 57_* 61_* 64_* 75_* 77_* 79_* 81_* 54_* | sed 's/\.py$//' | tr '\n' ' ')"
L2="$(cd $KB/level2 && ls 2_* 20_* 100_* 7_* | sed 's/\.py$//' | tr '\n' ' ')"
timeout ${SEEDS_S:-170} python3 bench/port/seeds.py --problems $KB/level1 --only $L1 --variant $V --out $R/s1 > $R/s1/log.txt 2>&1; echo "s1 rc=$?"
timeout ${SEEDS2_S:-90} python3 bench/port/seeds.py --problems $KB/level2 --only $L2 --variant $V --out $R/s2 > $R/s2/log.txt 2>&1; echo "s2 rc=$?"
timeout ${PORT_S:-250} python3 bench/port/run.py --only conv_transpose2d_sub_tanh --minutes 1 --no-compile --deadline-s $(( ${PORT_S:-250} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"
for s in s1 s2; do [ -f $R/$s/seeds.md ] && grep "^| " $R/$s/seeds.md | cut -c1-220 || tail -5 $R/$s/log.txt; done
grep "^| " $R/g/table.md | cut -c1-300
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c2.tgz c2 && cp c2/g/results.jsonl c2.jsonl; rm -rf c2
