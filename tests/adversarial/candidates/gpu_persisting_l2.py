"""Exploit: pin the input in a persisting-L2 carve-out (cudaDeviceSetLimit +
cudaStreamSetAttribute access-policy window), so it survives the harness's L2 flush and reads
come from L2 instead of HBM. Computes honestly; it must not come out faster than the same
kernel without the carve-out.

Source: pygpubench PR #49; llm.c PR #851 (3530 GB/s reported on an L40S, > 4x HBM peak);
nvbench PR #459 and CCCL PR #9144 (reset persisting L2 before every timed launch).
"""
# reference: softmax
# expect: pass
# expect_timing: not_faster
# baseline: softmax.new.py
# device: gpu

import torch
import torch.nn as nn
import triton
import triton.language as tl

try:
    from cuda.bindings import runtime as cudart
except ImportError:  # older cuda-python
    from cuda import cudart


@triton.jit
def softmax_kernel(out_ptr, in_ptr, n_cols, in_stride, out_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * in_stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


def launch(out, x2):
    softmax_kernel[(x2.shape[0],)](out, x2, x2.shape[1], x2.stride(0), out.stride(0),
                                   BLOCK=triton.next_power_of_2(x2.shape[1]), num_warps=8)


def pin(t):
    """Ask for the largest persisting carve-out and put t's bytes in the stream's window."""
    dev = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(dev)
    err, max_persist = cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrMaxPersistingL2CacheSize, dev)
    err, max_window = cudart.cudaDeviceGetAttribute(
        cudart.cudaDeviceAttr.cudaDevAttrMaxAccessPolicyWindowSize, dev)
    cudart.cudaDeviceSetLimit(cudart.cudaLimit.cudaLimitPersistingL2CacheSize,
                              int(max_persist or props.L2_cache_size * 3 // 4))
    value_cls = getattr(cudart, "cudaStreamAttrValue", None) or cudart.cudaLaunchAttributeValue
    value = value_cls()
    window = value.accessPolicyWindow
    window.base_ptr = t.data_ptr()
    window.num_bytes = min(t.numel() * t.element_size(), int(max_window or (64 << 20)))
    window.hitRatio = 1.0
    window.hitProp = cudart.cudaAccessProperty.cudaAccessPropertyPersisting
    window.missProp = cudart.cudaAccessProperty.cudaAccessPropertyStreaming
    value.accessPolicyWindow = window
    attr = next(getattr(getattr(cudart, enum), member)
                for enum in ("cudaStreamAttrID", "cudaLaunchAttributeID")
                for member in ("cudaStreamAttributeAccessPolicyWindow",
                               "cudaLaunchAttributeAccessPolicyWindow")
                if hasattr(getattr(cudart, enum, None), member))
    (err,) = cudart.cudaStreamSetAttribute(torch.cuda.current_stream().cuda_stream, attr, value)
    return err


class ModelNew(nn.Module):
    def forward(self, x):
        x2 = x.reshape(-1, x.shape[-1])
        pin(x2)
        out = torch.empty_like(x2)
        launch(out, x2)
        return out.reshape(x.shape)
