# Session 11, H200 call 3: the full port of KernelBench level 1's 63_conv at its own size
# (issue 13's five; call 2's try was not started: its --deadline-s was shorter than the port).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s3; mkdir -p $R/ports
timeout 380 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 2 --no-compile --deadline-s 330 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; tail -5 $R/ports/log.txt; grep "^| 63" $R/ports/table.md
rm -rf $R/ports/home/tmp 2>/dev/null
cd $OUT && tar czf s3.tgz s3 && rm -rf s3
