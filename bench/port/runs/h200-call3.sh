#!/usr/bin/env bash
# One nvidia-h200-x2 command: kernelab ports of the 5 memory-bound problems and the convolution
# (channels-last seed) on both GPUs (bench/port/run.py); at most 8 files come back in $OUT.
set -u
W=/tmp/call3; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 bench/port/run.py --out $W/p --gpus 0,1 --deadline-s 530 --reserve-s 45 --only \
  conv2d_relu_biasadd layernorm rmsnorm rmsnorm_llama gelu sum_reduction > $W/p.log 2>&1
cp $W/p.log $OUT/logs.txt; cp $W/p/results.jsonl $W/p/table.md $W/p/artifacts.tar.gz $OUT/
tail -30 $W/p/table.md
