#!/usr/bin/env bash
# Session 6, command 1 on one nvidia-h200: the changed seeds and their variants (unmasked
# attention and matmul loops, the FFN's own down-projection width, a program a row and
# evict-first loads for the row kernels, wider column blocks for the sum) against eager
# (bench/port/seeds.py); then SDPA and the FFN ported through the daemon's inbox (run.py --via
# inbox), torch.compile timed in its default mode only. At most 8 files come back in $OUT.
set -u
W=/tmp/s6c1; mkdir -p $W
export PYTHONUNBUFFERED=1
timeout 250 python3 bench/port/seeds.py --out $W/seeds --only sdpa ffn_llama3_8b layernorm softmax \
  rmsnorm rmsnorm_llama sum_reduction matmul_square --variant \
  bn128:BLOCK_N=128 st4:num_stages=4 st2:num_stages=2 bn128s2:BLOCK_N=128,num_stages=2 \
  d256:DOWN_BLOCK_N=256 d256s4:DOWN_BLOCK_N=256,num_stages=4 k32:BLOCK_K=32 g4:GROUP_M=4 \
  p0:PER_SM=0 p0t8:PER_SM=0,PER_THREAD=8 p0t32:PER_SM=0,PER_THREAD=32 ev:EVICT=1 \
  p0ev:PER_SM=0,EVICT=1 r1:PER_SM=1 r1ev:PER_SM=1,EVICT=1 s3:STAGES=3 \
  p16t32:PER_SM=16,PER_THREAD=32 p16t32ev:PER_SM=16,PER_THREAD=32,EVICT=1 \
  i128:BLOCK_INNER=128 i256:BLOCK_INNER=256,TILE=8192 i128w8:BLOCK_INNER=128,num_warps=8 \
  t4k:TILE=4096 t8kw8:TILE=8192,num_warps=8 i32:BLOCK_INNER=32 > $W/seeds.log 2>&1
LEFT=$((545 - SECONDS))
python3 bench/port/run.py --out $W/p --gpus 0 --via inbox --compile-modes default --deadline-s $LEFT \
  --reserve-s 35 --only sdpa ffn_llama3_8b > $W/p.log 2>&1
cp $W/seeds/seeds.md $W/seeds/seeds.jsonl $OUT/ 2>/dev/null
cat $W/seeds.log $W/p.log > $OUT/logs.txt
cp $W/p/results.jsonl $W/p/table.md $W/p/artifacts.tar.gz $OUT/ 2>/dev/null
cat $W/seeds/seeds.md; tail -22 $W/p/table.md
