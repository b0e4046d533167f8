# Session 21: the template proposer's first candidate on KernelBench problems no bench/port row
# covers, at their own sizes, beside eager and torch.compile default, with kernel profiles: where
# a template loses to the peers on problems it was never tuned for. SETS lists sets to run in
# turn as NAME:SECONDS (each set's time limit; a set's rows are kept as each problem ends):
# l1gemm, l1mem, l1conv (KernelBench level 1) and l2a, l2b (level 2); then, after the per-channel
# operand fix, "ops" (the problems whose operands were copied, and l2b's three that did not run)
# and "convx"/"gemmx" (the losing convolutions and the tall-skinny product with tunable variants;
# "convq"/"gemmq" the same, fewer, for a short call); "fix1"/"fix2" (session 22's narrowed tiles,
# one-read GroupNorm and norm decomposition on the problems that pointed to them); "conv1"/"conv2"
# (session 23's conv gather, store hints and per-channel BatchNorm, on the losing convolutions);
# "odd" (session 24: a conv output whose pixel count is odd, one image a program; L2 #83's forward
# reads module constants); "red" (session 24: a split reduction that fills the SMs); "gn" (GroupNorm's
# programs in one wave or two: 40 registers at 8 warps hold 6 programs an SM, 792 on an H100);
# "norm" (L2 normalisation as a row kernel; BatchNorm's constexpr operands); "mm24"/"ep24" (session 24:
# einsum as a matmul, triu/tril as a matmul epilogue; level 2 GEMM and conv epilogues newly matched);
# "ep25" (session 25: L2 #92 after full-size operands are read without "% n", with variants of its
# conv and logsumexp stages); "red2", "norm2", "conv2b" (the problems the earlier sets' limits cut);
# "scan" (the inductor proposer's port of cumulative sums and products, which no template matches);
# "fewc" (a K step of 16 for convolutions over few input channels, against the former 32);
# "dir2", "dir1a", "dir1b" (session 26: the direct K loop over few input channels, against the
# implicit GEMM, and on L1 #63's 16 channels; "dirq", "dirq1", "dirs" the same, fewer, for short calls);
# "l3a", "l3b" (session 28: level 3 blocks and whole networks as pipelines, with their first-call compile time);
# "l3g" (session 28: minGPT's attention and block, ReLU self-attention, traced at their sizes with the causal mask
# from a buffer; nn.MultiheadAttention and encoder layers written out; NetVLAD).
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>&1 | grep -v "^WARNING: Target"; export PYTHONPATH=/tmp/site:$PWD
chmod -R a+rX "$PWD" /tmp/site
export PYTHONUNBUFFERED=1
KB=bench/coverage/kernelbench
for SPEC in ${SETS:?NAME:SECONDS ...}; do
  S=${SPEC%%:*}; LIMIT=${SPEC##*:}; R=$OUT/$S; mkdir -p $R; VARIANTS=""; PROPOSER=template
  case $S in
    l1gemm) L=level1; ONLY="4_Matrix_vector_multiplication_ 7_Matmul_with_small_K_dimension_ 9_Tall_skinny_matrix_multiplication_
      10_3D_tensor_matrix_multiplication 13_Matmul_for_symmetric_matrices 16_Matmul_with_transposed_A 17_Matmul_with_transposed_B" ;;
    l1mem) L=level1; ONLY="24_LogSoftmax 33_BatchNorm 34_InstanceNorm 35_GroupNorm_ 38_L1Norm_ 39_L2Norm_ 42_Max_Pooling_2D
      45_Average_Pooling_2D 49_Max_reduction_over_a_dimension 88_MinGPTNewGelu" ;;
    l1conv) L=level1; ONLY="54_conv_standard_3D__square_input__square_kernel 57_conv_transposed_2D__square_input__square_kernel
      64_conv_transposed_1D 67_conv_standard_1D 82_conv_depthwise_2D_square_input_square_kernel 86_conv_depthwise_separable_2D
      87_conv_pointwise_2D" ;;
    l2a) L=level2; ONLY="12_Gemm_Multiply_LeakyReLU 18_Matmul_Sum_Max_AvgPool_LogSumExp_LogSumExp 22_Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish
      28_BMM_InstanceNorm_Sum_ResidualAdd_Multiply 30_Gemm_GroupNorm_Hardtanh 66_Matmul_Dropout_Softmax 84_Gemm_BatchNorm_Scaling_Softmax 99_Matmul_GELU_Softmax" ;;
    l2b) L=level2; ONLY="17_Conv2d_InstanceNorm_Divide 19_ConvTranspose2d_GELU_GroupNorm 23_Conv3d_GroupNorm_Mean
      34_ConvTranspose3d_LayerNorm_GELU_Scaling 43_Conv3d_Max_LogSumExp_ReLU 52_Conv2d_Activation_BatchNorm 73_Conv2d_BatchNorm_Scaling
      89_ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max" ;;
    fix1) L=level1; ONLY="9_Tall_skinny_matrix_multiplication_ 35_GroupNorm_ 37_FrobeniusNorm_ 4_Matrix_vector_multiplication_" ;;
    fix2) L=level2; ONLY="23_Conv3d_GroupNorm_Mean" ;;
    conv1) L=level1; ONLY="54_conv_standard_3D__square_input__square_kernel 63_conv_standard_2D__square_input__square_kernel
      87_conv_pointwise_2D 67_conv_standard_1D 86_conv_depthwise_separable_2D 50_conv_standard_2D__square_input__square_kernel" ;;
    conv2) L=level2; ONLY="73_Conv2d_BatchNorm_Scaling 52_Conv2d_Activation_BatchNorm 23_Conv3d_GroupNorm_Mean 17_Conv2d_InstanceNorm_Divide
      1_Conv2D_ReLU_BiasAdd 43_Conv3d_Max_LogSumExp_ReLU 6_Conv3d_Softmax_MaxPool_MaxPool" ;;
    odd) L=level2; ONLY="27_Conv3d_HardSwish_GroupNorm_Mean 83_Conv3d_GroupNorm_Min_Clamp_Dropout" ;;
    red) L=level1; ONLY="37_FrobeniusNorm_ 35_GroupNorm_" ;;
    gn) L=level1; ONLY="35_GroupNorm_" VARIANTS="w4:num_warps=4 b1kw4:BLOCK=1024,num_warps=4 b4kw16:BLOCK=4096,num_warps=16" ;;
    mm24) L=level1; ONLY="11_4D_tensor_matrix_multiplication 14_Matmul_for_upper_triangular_matrices 15_Matmul_for_lower_triangular_matrices" ;;
    ep24) L=level2; ONLY="80_Gemm_Max_Subtract_GELU 92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp" ;;
    ep25) L=level2; ONLY="92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp"
      VARIANTS="i128:s2_BLOCK_INNER=128 i256t8k:s2_BLOCK_INNER=256,s2_TILE=8192,s2_num_warps=8 w8:s2_num_warps=8,s2_STAGES=2
        k16:BLOCK_K=16 cl0:CHANNELS_LAST=0 m64w4:BLOCK_M=64,num_warps=4,num_stages=4" ;;
    scan) L=level1; ONLY="89_cumsum 91_cumsum_reverse 93_masked_cumsum" PROPOSER=inductor ;;
    fewc) L=level2; ONLY="92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp 73_Conv2d_BatchNorm_Scaling"
      VARIANTS="k32:BLOCK_K=32" ;;
    red2) L=level1; ONLY="37_FrobeniusNorm_" ;;
    norm2) L=level1; ONLY="39_L2Norm_" ;;
    conv2b) L=level2; ONLY="73_Conv2d_BatchNorm_Scaling 6_Conv3d_Softmax_MaxPool_MaxPool" ;;
    norm) L=level1; ONLY="39_L2Norm_ 33_BatchNorm" ;;
    dir2) L=level2; ONLY="23_Conv3d_GroupNorm_Mean 27_Conv3d_HardSwish_GroupNorm_Mean 83_Conv3d_GroupNorm_Min_Clamp_Dropout
      92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp 73_Conv2d_BatchNorm_Scaling 57_Conv2d_ReLU_HardSwish"
      VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4 dirm64:DIRECT=1,CHANNELS_LAST=0,num_warps=4,BLOCK_M=64
        dirm32:DIRECT=1,CHANNELS_LAST=0,num_warps=4,BLOCK_M=32 g64:BLOCK_M=64,num_warps=4,num_stages=4" ;;
    dir1a) L=level1; ONLY="54_conv_standard_3D__square_input__square_kernel"
      VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4 dirm64:DIRECT=1,CHANNELS_LAST=0,num_warps=4,BLOCK_M=64" ;;
    dirq) L=level2; ONLY="23_Conv3d_GroupNorm_Mean 92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp
      73_Conv2d_BatchNorm_Scaling 57_Conv2d_ReLU_HardSwish"
      VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4 dirm64:DIRECT=1,CHANNELS_LAST=0,num_warps=4,BLOCK_M=64
        g64:BLOCK_M=64,num_warps=4,num_stages=4" ;;
    dirs) L=level2; ONLY="23_Conv3d_GroupNorm_Mean 92_Conv2d_GroupNorm_Tanh_HardSwish_ResidualAdd_LogSumExp
      73_Conv2d_BatchNorm_Scaling" VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4" ;;
    dirq1) L=level1; ONLY="54_conv_standard_3D__square_input__square_kernel" VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4" ;;
    dir1b) L=level1; ONLY="63_conv_standard_2D__square_input__square_kernel"
      VARIANTS="dir:DIRECT=1,CHANNELS_LAST=0,num_warps=4 dirn32:DIRECT=1,CHANNELS_LAST=0,num_warps=4,BLOCK_N=32" ;;
    l3g) L=level3; ONLY="43_MinGPTCausalAttention 44_MiniGPTBlock 50_ReLUSelfAttention 31_VisionAttention
      32_ConvolutionalVisionTransformer 46_NetVladWithGhostClusters" ;;
    l3a) L=level3; ONLY="1_MLP 8_ResNetBasicBlock 6_GoogleNetInceptionModule 17_SqueezeNetFireModule 25_ShuffleNetUnit
      4_LeNet5 13_DenseNet121TransitionLayer" ;;
    l3b) L=level3; ONLY="9_ResNet18 19_MobileNetV1 18_SqueezeNet 11_VGG16" ;;
    ops) L=level1; ONLY="33_BatchNorm 38_L1Norm_ 39_L2Norm_" ;;
    ops2) L=level2; ONLY="52_Conv2d_Activation_BatchNorm 73_Conv2d_BatchNorm_Scaling 89_ConvTranspose3d_MaxPool_Softmax_Subtract_Swish_Max" ;;
    convx) L=level1; ONLY="87_conv_pointwise_2D 54_conv_standard_3D__square_input__square_kernel 86_conv_depthwise_separable_2D"
      VARIANTS="cl0:CHANNELS_LAST=0,s1_CHANNELS_LAST=0 cl0n128:CHANNELS_LAST=0,BLOCK_N=128,num_stages=2,s1_CHANNELS_LAST=0,s1_BLOCK_N=128,s1_num_stages=2
        k64:BLOCK_K=64,s1_BLOCK_K=64 m64w4:BLOCK_M=64,num_warps=4,num_stages=4,s1_BLOCK_M=64,s1_num_warps=4,s1_num_stages=4
        cl0m64:CHANNELS_LAST=0,BLOCK_M=64,num_warps=4,s1_CHANNELS_LAST=0,s1_BLOCK_M=64,s1_num_warps=4" ;;
    convq) L=level1; ONLY="87_conv_pointwise_2D 54_conv_standard_3D__square_input__square_kernel"
      VARIANTS="cl0:CHANNELS_LAST=0 cl0n128:CHANNELS_LAST=0,BLOCK_N=128,num_stages=2 k64:BLOCK_K=64 m64w4:BLOCK_M=64,num_warps=4,num_stages=4" ;;
    gemmq) L=level1; ONLY="9_Tall_skinny_matrix_multiplication_"
      VARIANTS="k32:BLOCK_K=32 k32ts:BLOCK_K=32,TMA=1,TMA_STORE=1,PERSISTENT=1 m64k32w4:BLOCK_M=64,BLOCK_K=32,num_warps=4,num_stages=4" ;;
    gemmx) L=level1; ONLY="9_Tall_skinny_matrix_multiplication_ 4_Matrix_vector_multiplication_"
      VARIANTS="k32:BLOCK_K=32 k32p:BLOCK_K=32,PERSISTENT=1 k32ts:BLOCK_K=32,TMA=1,TMA_STORE=1,PERSISTENT=1
        n256k32:BLOCK_N=256,BLOCK_K=32 m64k32w4:BLOCK_M=64,BLOCK_K=32,num_warps=4,num_stages=4" ;;
  esac
  timeout $LIMIT python3 bench/port/seeds.py --out $R --problems $KB/$L --only $ONLY --peers default --profile 3 --proposer $PROPOSER \
    --max-timing-s 1.5 ${VARIANTS:+--variant $VARIANTS} > $R/log.txt 2>&1; echo "$S rc=$?"
done
for S in $OUT/*/; do sed -n '/^| problem/,/^$/p' $S/seeds.md 2>/dev/null | cut -c1-160; done
python3 - <<'PY'
import json, os, glob
for f in sorted(glob.glob(os.environ["OUT"] + "/*/seeds.jsonl")):
    for line in open(f):
        r = json.loads(line); ms = r.get("ms", {})
        peer = min((v for k, v in ms.items() if k in ("eager", "compile")), default=None)
        ours = {k: v for k, v in ms.items() if k not in ("eager", "compile")}
        best = min(ours, key=ours.get, default=None)
        print(f"{r['problem'][:44]:44} wall {r.get('wall_s')}s " + (
            f"seed/best-peer {peer / ours['seed']:.3f}x, best {best} {peer / ours[best]:.3f}x"
            if peer and "seed" in ours else f"errors {json.dumps(r.get('errors'))[:200]}"))
PY
