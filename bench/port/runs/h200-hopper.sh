#!/usr/bin/env bash
# Issue 15: the Hopper templates (persistent TMA GEMMs, split-K, the fused gated MLPs, the row and
# reduction kernels) against eager and cuBLAS at LLM shapes, each seed beside its known-good
# starts, on one nvidia-h200: about 5 minutes (no case starts after 420 s). At most 8 files come
# back in $OUT.
set -u
mkdir -p $OUT/h
timeout 570 python3 bench/port/hopper.py --out $OUT/h --deadline-s 420 > $OUT/h/log.txt 2>&1
tail -n 5 $OUT/h/log.txt
cat $OUT/h/hopper.md
