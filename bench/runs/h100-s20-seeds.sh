# Session 20: seeds.py with kernel profiles on the problems that lose to the best peer or miss
# 90 % of the copy rate. SET picks the set: "attention" (the three attention problems: the
# SPLIT_MASK and TMA tunables, untimed until now, and tile variants), "gemm"
# (linear_residual_fp16_odd and matmul_bf16_large_k: tile, split and pack variants), "rows" (the
# wide-row problems: the split kernel's programs an SM, chunk and stages, and the looped kernel)
# or "bmm" (KernelBench L1 #3 at its own size: the batched matmul template), each beside
# torch.compile default and with --profile 5 (which kernels each variant spends its time in).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
S=${SET:?attention or gemm}; R=$OUT/$S; mkdir -p $R
if [ "$S" = attention ]; then
  ONLY="sdpa sdpa_causal_bf16 attention_written_fp16"
  VARIANTS="sm0:SPLIT_MASK=0 tma:TMA=1 tma_n128:TMA=1,BLOCK_N=128 tma_s2:TMA=1,num_stages=2 tma_s4:TMA=1,num_stages=4
            n128:BLOCK_N=128 w4:num_warps=4 m64w4:BLOCK_M=64,num_warps=4 m64w4tma:BLOCK_M=64,num_warps=4,TMA=1
            tma_n128_s2:TMA=1,BLOCK_N=128,num_stages=2"
elif [ "$S" = rows ]; then
  ONLY="softmax_wide_rows layernorm_wide softmax_bf16_cast_odd"
  VARIANTS="sm1:SPLIT_PER_SM=1 sm4:SPLIT_PER_SM=4 sm8:SPLIT_PER_SM=8 c8k:CHUNK=8192 c8ksm4:CHUNK=8192,SPLIT_PER_SM=4
            c4ksm8:CHUNK=4096,SPLIT_PER_SM=8 s1:SPLIT_STAGES=1 s3:SPLIT_STAGES=3 s3sm4:SPLIT_STAGES=3,SPLIT_PER_SM=4
            loop:SPLIT=2 loop0:SPLIT=2,PER_SM=0"
elif [ "$S" = bmm ]; then
  ONLY="3_Batched_matrix_multiplication"; EXTRA="--problems bench/coverage/kernelbench/level1"
  VARIANTS="tma:TMA=1,BLOCK_K=32,num_stages=4 n64:BLOCK_N=64 np:PERSISTENT=0"
else
  ONLY="linear_residual_fp16_odd matmul_bf16_large_k"
  VARIANTS="n128:BLOCK_N=128 m256n128:BLOCK_M=256,BLOCK_N=128 n128s4:BLOCK_N=128,num_stages=4 pack0:PACK=0
            np:PERSISTENT=0 g16:GROUP_M=16 sk16:SPLIT_K=16 sk32:SPLIT_K=32
            tuned:BLOCK_N=64,BLOCK_K=128,WARP_SPECIALIZE=1,num_stages=4,num_warps=4
            n128k128s4:BLOCK_N=128,BLOCK_K=128,num_stages=4"
fi
timeout ${LIMIT_S:-560} python3 bench/port/seeds.py --out $R --only $ONLY $EXTRA --peers default --profile 5 \
  --variant $VARIANTS > $R/log.txt 2>&1; echo "rc=$?"
tail -n 120 $R/seeds.md 2>/dev/null | cut -c1-260 || tail -30 $R/log.txt
