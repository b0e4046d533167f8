# Session 20: seeds.py with kernel profiles on the problems that lose to the best peer or miss
# 90 % of the copy rate, and on the new templates at KernelBench's own sizes. SETS lists sets to
# run in turn, each as NAME:SECONDS (its time limit): "attention" (the three attention problems:
# the SPLIT_MASK and TMA tunables, untimed until now, and tile variants), "gemm"
# (linear_residual_fp16_odd and matmul_bf16_large_k: tile, split and pack variants), "rows" (the
# wide-row problems: the split kernel's programs an SM, chunk and stages, and the looped kernel)
# or "kb" (KernelBench L1 #3's bmm and #97's SDPA with 1024-wide heads at their own sizes: the
# batched matmul and the materialised attention), each beside torch.compile default and with
# --profile 5 (which kernels each variant spends its time in).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
for SPEC in ${SETS:?NAME:SECONDS ...}; do
  S=${SPEC%%:*}; LIMIT=${SPEC##*:}; R=$OUT/$S; mkdir -p $R; EXTRA=""
  case $S in
    attention) ONLY="sdpa sdpa_causal_bf16 attention_written_fp16"
      VARIANTS="sm0:SPLIT_MASK=0 tma:TMA=1 tma_n128:TMA=1,BLOCK_N=128 tma_s2:TMA=1,num_stages=2 tma_s4:TMA=1,num_stages=4
                n128:BLOCK_N=128 w4:num_warps=4 m64w4:BLOCK_M=64,num_warps=4 m64w4tma:BLOCK_M=64,num_warps=4,TMA=1
                tma_n128_s2:TMA=1,BLOCK_N=128,num_stages=2" ;;
    rows) ONLY="softmax_wide_rows layernorm_wide softmax_bf16_cast_odd"
      VARIANTS="sm1:SPLIT_PER_SM=1 sm4:SPLIT_PER_SM=4 sm8:SPLIT_PER_SM=8 c8k:CHUNK=8192 c8ksm4:CHUNK=8192,SPLIT_PER_SM=4
                c4ksm8:CHUNK=4096,SPLIT_PER_SM=8 s1:SPLIT_STAGES=1 s3:SPLIT_STAGES=3 s3sm4:SPLIT_STAGES=3,SPLIT_PER_SM=4
                loop:SPLIT=2 loop0:SPLIT=2,PER_SM=0" ;;
    kb) ONLY="3_Batched_matrix_multiplication 97_ScaledDotProductAttention"; EXTRA="--problems bench/coverage/kernelbench/level1"
      VARIANTS="k32s4:BLOCK_K=32,num_stages=4 n64:BLOCK_N=64 w4:num_warps=4 tma:TMA=1,BLOCK_K=32,num_stages=4" ;;
    gemm) ONLY="linear_residual_fp16_odd matmul_bf16_large_k"
      VARIANTS="n128:BLOCK_N=128 m256n128:BLOCK_M=256,BLOCK_N=128 n128s4:BLOCK_N=128,num_stages=4 pack0:PACK=0
                np:PERSISTENT=0 g16:GROUP_M=16 sk16:SPLIT_K=16 sk32:SPLIT_K=32
                tuned:BLOCK_N=64,BLOCK_K=128,WARP_SPECIALIZE=1,num_stages=4,num_warps=4
                n128k128s4:BLOCK_N=128,BLOCK_K=128,num_stages=4" ;;
  esac
  timeout $LIMIT python3 bench/port/seeds.py --out $R --only $ONLY $EXTRA --peers default --profile 5 \
    --max-timing-s 2 --variant $VARIANTS > $R/log.txt 2>&1; echo "$S rc=$?"
  grep "^\[" $R/log.txt | cut -c1-400
done
for S in $OUT/*/; do tail -n 100 $S/seeds.md 2>/dev/null | cut -c1-220; done
