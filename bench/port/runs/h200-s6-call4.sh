#!/usr/bin/env bash
# Session 6, command 4 on one nvidia-h200 (the device time left, 18 s of wall): the 3xTF32 seeds
# of the two GEMMs not re-ported this session, for a same-tile comparison with session 5's
# figures after the unmasked K loop. At most 8 files come back in $OUT.
set -u
mkdir -p $OUT/s
timeout 100 python3 bench/port/seeds.py --out $OUT/s --only gemm_add_relu matmul_irregular \
  --variant k32:BLOCK_K=32 > $OUT/s/log.txt 2>&1
cat $OUT/s/seeds.md
