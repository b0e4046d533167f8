#!/usr/bin/env bash
# Session 6, command 3 on one nvidia-h200: RMSNorm (new row seed), matmul_square and
# matmul_gelu_softmax (unmasked K loop, wrapped rows; the fp32 floor at a third of the TF32
# rate lets the tuner run) ported through the daemon's inbox, torch.compile in its default mode
# only; first, more variants of the sum reduction's seed. At most 8 files come back in $OUT.
set -u
W=/tmp/s6c3; mkdir -p $W
export PYTHONUNBUFFERED=1
timeout 60 python3 bench/port/seeds.py --out $W/seeds --only sum_reduction --variant t1k:TILE=1024 \
  w2:num_warps=2 t1kw2:TILE=1024,num_warps=2 i128t4k:BLOCK_INNER=128,TILE=4096 w8:num_warps=8 \
  > $W/seeds.log 2>&1
LEFT=$((540 - SECONDS))
python3 bench/port/run.py --out $W/p --gpus 0 --via inbox --compile-modes default --deadline-s $LEFT \
  --reserve-s 35 --only rmsnorm matmul_square matmul_gelu_softmax > $W/p.log 2>&1
cp $W/seeds/seeds.md $W/seeds/seeds.jsonl $OUT/ 2>/dev/null
cat $W/seeds.log $W/p.log > $OUT/logs.txt
cp $W/p/results.jsonl $W/p/table.md $W/p/artifacts.tar.gz $OUT/ 2>/dev/null
cat $W/seeds/seeds.md; tail -24 $W/p/table.md
