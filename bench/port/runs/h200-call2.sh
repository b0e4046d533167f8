#!/usr/bin/env bash
# One nvidia-h200-x2 command: kernelab ports of 8 problems on both GPUs, one problem per GPU at a
# time (bench/port/run.py), after the seeds learnt in call 1; at most 8 files come back in $OUT.
set -u
W=/tmp/call2; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 bench/port/run.py --out $W/p --gpus 0,1 --deadline-s 545 --reserve-s 50 --only \
  ffn_llama3_8b matmul_irregular matmul_square gemm_add_relu matmul_gelu_softmax sdpa softmax \
  conv2d_relu_biasadd > $W/p.log 2>&1
cp $W/p.log $OUT/logs.txt; cp $W/p/results.jsonl $W/p/table.md $W/p/artifacts.tar.gz $OUT/
tail -32 $W/p/table.md
