#!/usr/bin/env bash
# One nvidia-h200-x2 command (bench/port/README.md, "H200 results"): the seeds' variants on GPU 0
# (bench/port/seeds.py), kernelab ports on GPU 1 meanwhile, then on GPU 0 too; what comes back
# is copied to $OUT at the end (at most 8 files).
set -u
W=/tmp/call1; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 bench/port/run.py --out $W/p1 --gpus 1 --only ffn_llama3_8b gemm_add_relu matmul_square \
  --deadline-s 500 --reserve-s 60 > $W/p1.log 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=0 timeout 260 python3 bench/port/seeds.py --out $W/seeds --variant \
  r1:PER_SM=1,STAGES=1 r2:PER_SM=2,STAGES=2 r8:PER_SM=8,STAGES=1 r16:PER_SM=16,STAGES=1 \
  t32:PER_THREAD=32,STAGES=1 t8:PER_THREAD=8 s3:STAGES=3 \
  n64:BLOCK_N=64 k16:BLOCK_K=16 k64:BLOCK_K=64 st4:num_stages=4 st3:num_stages=3 w4:num_warps=4 \
  bm64:BLOCK_M=64 bn128:BLOCK_N=128 b4k:BLOCK_SIZE=4096 b4kw8:BLOCK_SIZE=4096,num_warps=8 \
  > $W/seeds.log 2>&1
LEFT=$((500 - SECONDS))
python3 bench/port/run.py --out $W/p0 --gpus 0 --only softmax rmsnorm_llama \
  --deadline-s $LEFT --reserve-s 60 > $W/p0.log 2>&1
wait $P1
cp $W/seeds/seeds.md $W/seeds/seeds.jsonl $OUT/ 2>/dev/null
cat $W/seeds.log $W/p0.log $W/p1.log > $OUT/logs.txt
cp $W/p0/results.jsonl $OUT/p0.results.jsonl; cp $W/p1/results.jsonl $OUT/p1.results.jsonl
tar -czf $OUT/artifacts.tar.gz -C $W p0/artifacts.tar.gz p1/artifacts.tar.gz 2>/dev/null
python3 bench/port/run.py --report $W/p0/results.jsonl $W/p1/results.jsonl --out $W/merged > /dev/null
cp $W/merged/table.md $OUT/table.md
cat $W/seeds/seeds.md; cat $W/merged/table.md | tail -30
