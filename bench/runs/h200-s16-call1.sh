# Session 16, H200 call 1: issue 15's generalised convolution template on the GPU: bench/port's
# conv2d (the template's first problem, its kernel re-emitted for groups and 1-3 axes) and the two
# problems added with it (KernelBench L2 #47's Conv3d and L2 #5's strided ConvTranspose2d at
# their sizes), 1 GPU-minute each, with the jobs' own torch.compile peers.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
R=$OUT/c1; mkdir -p $R/g
timeout ${LIMIT_S:-560} python3 bench/port/run.py --only ${PROBLEMS:-conv3d_mish_tanh conv_transpose2d_sub_tanh conv2d_relu_biasadd} --minutes 1 --no-compile --deadline-s $(( ${LIMIT_S:-560} - 10 )) --out $R/g > $R/g/log.txt 2>&1; echo "g rc=$?"; grep "^| " $R/g/table.md | cut -c1-300
find $R -name tmp -type d -prune -exec rm -rf {} + 2>/dev/null
cd $OUT && tar czf c1.tgz c1 && cp c1/g/results.jsonl c1.jsonl; cp c1/g/log.txt c1-log.txt; rm -rf c1
