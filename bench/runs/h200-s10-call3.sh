# Session 10, H200 call 3 (one nvidia-h200, the session's last ~10 minutes of device time):
# ports of KernelBench level 1's 97_SDPA and 63_conv at their own sizes (issue 13), then the
# Hopper templates against eager and cuBLAS until a 160 s deadline (issue 15; goals first).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s3; mkdir -p $R/ports $R/h
timeout 290 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 97_ScaledDotProductAttention 63_conv_standard_2D__square_input__square_kernel --minutes 0.5 --no-compile --deadline-s 270 --reserve-s 35 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; grep -E "^\| (97|63)" $R/ports/table.md
timeout 235 python3 bench/port/hopper.py --out $R/h --deadline-s 150 > $R/h/log.txt 2>&1; echo "hopper rc=$?"; tail -n 3 $R/h/log.txt; cat $R/h/hopper.md
cd $OUT && tar czf s3.tgz s3 && rm -rf s3
