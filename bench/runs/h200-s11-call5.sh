# Session 11, H200 call 5 (the session's last device minutes): the 63_conv port again, after
# call 4's job was lost to the re-check's float64 `square()` of its 8 GiB output (now a
# reduction, `squared_norm`).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/s5; mkdir -p $R/ports
timeout 190 python3 bench/port/run.py --problems bench/coverage/kernelbench/level1 --only 63_conv_standard_2D__square_input__square_kernel --minutes 1.5 --no-compile --deadline-s 180 --out $R/ports > $R/ports/log.txt 2>&1; echo "ports rc=$?"; grep "^| 63" $R/ports/table.md
rm -rf $R/ports/home/tmp 2>/dev/null
cd $OUT && tar czf s5.tgz s5 && rm -rf s5
