# Session 14, H200 call 2: issue 14's 1-GPU-minute bench/port table, the GEMM, conv and attention problems
# not measured in session 12 (bench/port/results/2026-12-03-h200-s12-1min has the other 6).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c2; mkdir -p $R/g
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv,noheader | tee $R/gpu.txt
timeout 570 python3 bench/port/run.py --only matmul_gelu_softmax conv2d_relu_biasadd sdpa --minutes 1 --no-compile --deadline-s 560 --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c2.tgz c2 && cp c2/g/results.jsonl c2.jsonl; cp c2/g/log.txt c2-log.txt; rm -rf c2
