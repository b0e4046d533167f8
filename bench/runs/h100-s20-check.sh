# Session 20, after the seeds runs (bench/runs/h100-s20-seeds.sh): the new seeds and kernels
# timed beside eager and torch.compile default, with kernel profiles: the split-K sum reducing
# slices in blocks, the pack copy as one Triton launch, the materialised attention's values
# packed K-major, the split row kernel at 8 programs an SM, the 64×64 half attention seed.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
run() {  # NAME SECONDS ARGS...
  local R=$OUT/$1 LIMIT=$2; shift 2; mkdir -p $R
  timeout $LIMIT python3 bench/port/seeds.py --out $R --peers default --profile 5 --max-timing-s 2 "$@" > $R/log.txt 2>&1
  echo "$(basename $R) rc=$?"; grep "^\[" $R/log.txt | cut -c1-300
}
run kb 150 --problems bench/coverage/kernelbench/level1 --only 3_Batched_matrix_multiplication 97_ScaledDotProductAttention
run gemm 120 --only linear_residual_fp16_odd matmul_bf16_large_k matmul_square --variant n128s4:BLOCK_N=128,num_stages=4
run rows 120 --only softmax_wide_rows layernorm_wide softmax_bf16_cast_odd --variant old:SPLIT_PER_SM=2
run attention 100 --only sdpa sdpa_causal_bf16 attention_written_fp16
