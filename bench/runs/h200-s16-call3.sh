# Session 16, H200 call 3: the transposed convolution's phase made the fastest-varying program
# index (call 2 ran phase-major: a tile's output sectors were completed by programs a whole phase
# apart in launch order), timed on the KernelBench level-1 problems where call 2's seed lost to
# eager (strided by 2-5, dilated, grouped) and one it won; then KernelBench level 2's
# ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide at its own size, ported at 1 GPU-minute
# with the job's own torch.compile peers.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c3; mkdir -p $R/s1 $R/g
KB=bench/coverage/kernelbench
L1="$(cd $KB/level1 && ls 75_* 77_* 81_* 57_* | sed 's/\.py$//' | tr '\n' ' ')"
timeout ${SEEDS_S:-150} python3 bench/port/seeds.py --problems $KB/level1 --only $L1 --variant k64:BLOCK_K=64 n16:BLOCK_N=16 m64:BLOCK_M=64 --out $R/s1 > $R/s1/log.txt 2>&1; echo "s1 rc=$?"
timeout ${PORT_S:-270} python3 bench/port/run.py --problems $KB/level2 --only 2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide --minutes 1 --no-compile --deadline-s $(( ${PORT_S:-270} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"
[ -f $R/s1/seeds.md ] && grep "^| " $R/s1/seeds.md | cut -c1-60,100-220 || tail -5 $R/s1/log.txt
grep "^| \|^- .*own timing" $R/g/table.md | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c3.tgz c3 && cp c3/g/results.jsonl c3.jsonl; rm -rf c3
