# Session 10, H200 call 4 (the session's last 4 minutes of device time): the two memory refusals
# of call 1's sweep that ran beside other problems, again alone (issue 13).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
timeout 85 python3 bench/kernelbench/sweep.py --out $OUT/sweep4 --device cuda --only level1/20_LeakyReLU level1/37_FrobeniusNorm_ --timeout-s 80 2>&1 | tail -n 4
rm -rf $OUT/sweep4/home
