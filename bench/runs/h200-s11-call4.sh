# Session 11, H200 call 4, after the fixes calls 1-3 showed: arenas made after torch's cache
# gives its blocks back, the probe's free memory without its own tensors, a reseed short of
# memory restarting the incumbent, candidates' spare sandboxes found for `--device cuda`.
# (1) a candidate out of GPU memory is its own failure; (2) 94_MSELoss and 96_HuberLoss, refused
# in call 1 on a free-memory figure that still held the probe's tensors, again; (3) the 63_conv
# port whose job call 3 lost to CUDA_ERROR_OUT_OF_MEMORY; (4) issue 14's screening bench
# (first verified port, stages of each evaluation).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s4; mkdir -p $R/ports $R/screen
timeout 60 python3 -m kernelabd check examples/softmax.py tests/adversarial/candidates/gpu_out_of_memory.py --device cuda --json --home $R/home-check > $R/oom-check.json 2> $R/oom-check.err; echo "oom check rc=$?"; cut -c1-400 $R/oom-check.json
timeout 70 python3 bench/kernelbench/sweep.py --out $R/sweep --device cuda --only level1/94_MSELoss level1/96_HuberLoss --timeout-s 60 2>&1 | tail -n 3
cp $R/sweep/rows.jsonl $OUT/rows-s11-call4.jsonl
timeout 170 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 1.5 --no-compile --deadline-s 160 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; grep "^| 63" $R/ports/table.md
timeout 250 python3 bench/screen/run.py --out $R/screen --minutes 0.75 --only layernorm matmul_square softmax --timeout-s 80 > $R/screen/log.txt 2>&1; echo "screen rc=$?"; tail -12 $R/screen/log.txt
rm -rf $R/sweep/home $R/ports/home/tmp $R/home-check 2>/dev/null
cd $OUT && tar czf s4.tgz s4 && rm -rf s4
