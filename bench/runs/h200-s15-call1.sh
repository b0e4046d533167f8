# Session 15, H200 call 1: issue 14's screening benchmark (bench/screen, one home, template and
# tune, 1 GPU-minute a problem, no torch.compile peers: their wall is not charged) on the
# memory-bound half of bench/port, with the sandbox memory fix (bef7b7e) and the background
# start of the screening sandbox (d67db47) that no earlier GPU run had.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/${TAG:-s1}; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout ${LIMIT_S:-555} python3 bench/screen/run.py --out $R/screen --minutes 1 --no-peers --timeout-s 150 --only ${PROBLEMS:-softmax gelu layernorm rmsnorm sum_reduction rmsnorm_llama} > $R/log.txt 2>&1; echo "screen rc=$?"
tail -30 $R/log.txt | cut -c1-400
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf ${TAG:-s1}.tgz ${TAG:-s1} && rm -rf ${TAG:-s1}
