"""Concatenation and stacking along one dim (``torch.cat``, ``torch.concat``,
``torch.concatenate``, ``torch.stack``): each input copied into its slice of the output.

On its own a concatenation is a copy with nothing to gain over eager's. It is a template so
that the graphs built around one become pipelines (``template.pipeline``): an Inception module's
four branches, a DenseNet block's growing feature list, a U-Net's skip connections, each branch
a convolution stage whose result this stage copies into place.

Seen as ``(rows, dim × inner)`` (rows: the sizes before the dim, inner: those after it), an
input is a slab of whole rows and its place in the output a column offset, so one launch an
input copies its slab with no division per element: a program owns ``BLOCK`` columns and walks
the rows (a grid-stride loop, since a grid's second axis holds at most 65535 programs). Column
counts and offsets divisible by 16, as those of a channel concatenation of images are, let
Triton vectorise the copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from kernelabd.propose.templates import common

TUNE_VALUES = {"BLOCK": [512, 1024, 2048, 4096], "num_warps": [2, 4, 8]}
SM90_STARTS: dict[str, list[dict[str, int]]] = {
    "any": [{"BLOCK": 1024, "num_warps": 4}, {"BLOCK": 4096, "num_warps": 8}],
}
"""The elementwise template's seed (1024 elements, 4 warps: 98 % of the copy rate for its GELU
on the H200), then a larger block; not measured for this copy on a GPU. Each dict sets every
tunable."""
MAX_ROW_PROGRAMS = 65535
"""The most programs a launch grid's second axis takes."""


@dataclass(frozen=True)
class Concat:
    parts: tuple[str, ...]     # each input's forward expression
    dim: int                   # non-negative, in the output's rank
    stack: bool                # torch.stack: each input gains the dim, of size 1


KERNEL = '''

@triton.jit
def cat_copy_kernel(src_ptr, dst_ptr, rows, cols, dst_cols, offset, BLOCK: tl.constexpr):
    col = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = col < cols
    for row in range(tl.program_id(1), rows, tl.num_programs(1)):
        r = tl.cast(row, tl.int64)
        v = tl.load(src_ptr + r * cols + col, mask=mask)
        tl.store(dst_ptr + r * dst_cols + offset + col, v, mask=mask)
'''


def forward(op: Concat, signature: str) -> str:
    """The launches; the inputs are of one dtype (the matcher's condition), the output's."""
    view = f".unsqueeze({op.dim})" if op.stack else ""
    parts = ", ".join(f"{p}{view}.contiguous()" for p in op.parts)
    return f"""
def forward(self, {signature}):
    _parts = [{parts}]
    _shape = list(_parts[0].shape)
    _shape[{op.dim}] = sum(_p.shape[{op.dim}] for _p in _parts)
    _out = torch.empty(_shape, device=_parts[0].device, dtype=_parts[0].dtype)
    _rows = math.prod(_shape[:{op.dim}])
    _inner = math.prod(_shape[{op.dim} + 1:])
    _offset = 0
    for _p in _parts:
        _cols = _p.shape[{op.dim}] * _inner
        if _p.numel():
            _grid = (triton.cdiv(_cols, BLOCK), min(_rows, {MAX_ROW_PROGRAMS}))
            cat_copy_kernel[_grid](_p, _out, _rows, _cols, _shape[{op.dim}] * _inner, _offset,
                                   BLOCK=BLOCK, num_warps=num_warps)
        _offset += _cols
    return _out
"""


def render(op: Concat, signature: str, imports: list[str], init: str) -> tuple[str, str]:
    what = f"{'stack' if op.stack else 'concatenation'} of {len(op.parts)} along dim {op.dim}"
    source = (common.header(f"Template: {what}, each input copied into its slice of the output.", imports)
              + common.tunables(TUNE_VALUES, SM90_STARTS["any"][0]) + f"STARTS = {SM90_STARTS['any']!r}\n"
              + KERNEL + common.model_class(init, forward(op, signature)))
    return source, f"template: {what} (a copy a launch)"
