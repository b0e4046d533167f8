"""Elementwise chains: every op of the chain in one kernel, one read of each operand and one
write of the result (eager launches one kernel per op and round-trips each intermediate
through memory)."""

from __future__ import annotations

from kernelabd.propose.templates import common


def kernel(chain: common.Chain) -> str:
    lines = [
        "offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)",
        "mask = offs < n",
        *chain.loads("offs", "mask"),
        *chain.lines,
        f"tl.store(out_ptr + offs, {chain.result}, mask=mask)",
    ]
    body = "\n".join(f"    {line}" for line in lines)
    return (f"\n\n@triton.jit\ndef fused_kernel(out_ptr, n{chain.kernel_args()}, "
            f"BLOCK_SIZE: tl.constexpr):\n{body}\n")


def forward(chain: common.Chain, signature: str, dtype_of: str) -> str:
    shapes = ", ".join(f"{t}.shape" for t in chain.tensors)
    return f'''
def forward(self, {signature}):
    shape = torch.broadcast_shapes({shapes})
    out = torch.empty(shape, device={dtype_of}.device, dtype={dtype_of}.dtype)
    n = out.numel()
    grid = (triton.cdiv(n, BLOCK_SIZE),)
    fused_kernel[grid](out, n{chain.call_args("shape")}, BLOCK_SIZE=BLOCK_SIZE,
                       num_warps=num_warps)
    return out
'''


TUNE_VALUES = {"BLOCK_SIZE": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8]}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [{"BLOCK_SIZE": 1024, "num_warps": 4}, {"BLOCK_SIZE": 2048, "num_warps": 8},
            {"BLOCK_SIZE": 4096, "num_warps": 8}],
}
"""Known-good starting configurations on sm_90, the seed first: 1024 elements and 4 warps ran
the port benchmark's GELU at 98 % of the copy rate on the H200 (bench/port/README.md); then
larger blocks, 8 elements a thread either way. Each dict sets every tunable."""


def render(chain: common.Chain, ops: list[str], signature: str, dtype_of: str,
           imports: list[str], init: str) -> tuple[str, str]:
    names = " → ".join(ops)
    seed = SM90_STARTS["any"][0]
    source = (common.header(f"Template: elementwise chain ({names}) fused into one kernel.", imports)
              + common.tunables(TUNE_VALUES, seed) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + common.OPERAND_HELPER + kernel(chain)
              + common.model_class(init, forward(chain, signature, dtype_of)))
    return source, f"template: elementwise chain of {len(ops)} ops ({names}) fused"
