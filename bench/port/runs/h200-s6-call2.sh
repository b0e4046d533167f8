#!/usr/bin/env bash
# Session 6, command 2 on one nvidia-h200: LayerNorm, softmax and the sum reduction (the
# memory-bound rows short of their goals) ported through the daemon's inbox with the new row
# seed (32 elements a thread up to 8 warps, 16 programs an SM); torch.compile timed in its default
# mode only. At most 8 files come back in $OUT.
set -u
W=/tmp/s6c2; mkdir -p $W
export PYTHONUNBUFFERED=1
python3 bench/port/run.py --out $W/p --gpus 0 --via inbox --compile-modes default --deadline-s 540 \
  --reserve-s 35 --only layernorm softmax sum_reduction > $W/p.log 2>&1
cp $W/p.log $OUT/logs.txt
cp $W/p/results.jsonl $W/p/table.md $W/p/artifacts.tar.gz $OUT/ 2>/dev/null
tail -24 $W/p/table.md
