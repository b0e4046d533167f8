"""Einsums of two operands as products: ``plan`` against ``torch.einsum`` itself over equations
of every kind it takes (batch dims, several free and contracted dims, ellipses, implicit outputs,
a permuted output) and declines, then references written with einsum ported by the matmul
template and passing the real gate on CPU (Triton interpreter)."""

from __future__ import annotations

import pytest
import torch

from kernelabd.propose.template.einsum import Plan, plan
from tests.propose.test_template import assert_ported


def _product(p: Plan, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What the rewritten graph computes, written with the plan's own ops."""
    a = (a.permute(p.perm_a) if p.perm_a else a).flatten(*p.flat_a)
    b = (b.permute(p.perm_b) if p.perm_b else b).flatten(*p.flat_b)
    y = torch.matmul(a, b)
    return y.permute(p.perm_out) if p.perm_out else y


# equation -> the operands' shapes
PRODUCTS = {
    "ij,jk->ik": ((5, 6), (6, 7)),
    "bijl,lk->bijk": ((2, 3, 4, 5), (5, 6)),
    "bij,bjk->bik": ((3, 4, 5), (3, 5, 6)),
    "bhqd,bhkd->bhqk": ((2, 3, 4, 5), (2, 3, 6, 5)),
    "bhqk,bhkd->bhqd": ((2, 3, 4, 6), (2, 3, 6, 5)),
    "ji,jk->ik": ((6, 5), (6, 7)),
    "ik,kj->ji": ((5, 6), (6, 7)),
    "abc,bcd->ad": ((3, 4, 5), (4, 5, 6)),
    "acb,dcb->ad": ((3, 5, 4), (6, 5, 4)),
    "nchw,co->nhwo": ((2, 3, 4, 5), (3, 6)),
    "...ij,jk->...ik": ((2, 3, 4, 5), (5, 6)),
    "...ij,...jk->...ik": ((3, 4, 5), (3, 5, 6)),
    "ij,jk": ((5, 6), (6, 7)),
    "kj,ik": ((6, 7), (5, 6)),
    "b i j, b j k -> b k i": ((3, 4, 5), (3, 5, 6)),
}


@pytest.mark.parametrize("equation", sorted(PRODUCTS))
def test_the_plan_computes_what_einsum_does(equation):
    shape_a, shape_b = PRODUCTS[equation]
    found = plan(equation, shape_a, shape_b)
    assert found is not None
    a, b = torch.randn(shape_a, dtype=torch.float64), torch.randn(shape_b, dtype=torch.float64)
    expected = torch.einsum(equation, a, b)
    got = _product(found, a, b)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected)


# equations that are not one product, or not one the matmul template takes: they stay einsums
NOT_PRODUCTS = {
    "ii,ij->ij": ((4, 4), (4, 5)),            # a diagonal
    "ij,jk->i": ((5, 6), (6, 7)),             # k summed in one operand alone
    "i,j->ij": ((5,), (6,)),                  # an outer product: nothing contracted
    "ij,j->i": ((5, 6), (6,)),                # no free dim of the second operand
    "ij,jkl->ikl": ((5, 6), (6, 7, 8)),       # two free dims of the second operand
    "bij,bjk->bik": ((1, 4, 5), (3, 5, 6)),   # a batch dim that broadcasts
    "bxij,bjk->bxik": ((2, 3, 4, 5), (2, 5, 6)),  # two free dims of the first beside a batch dim
    "ij,jk,kl->il": ((2, 3), (3, 4)),         # three operands' equation
}


@pytest.mark.parametrize("equation", sorted(NOT_PRODUCTS))
def test_what_is_not_one_product_is_declined(equation):
    assert plan(equation, *NOT_PRODUCTS[equation]) is None


# name -> (forward body, inputs): einsum references, with and without an epilogue
EINSUMS = {
    "tensor_matrix_4d": ('torch.einsum("bijl,lk->bijk", x, w)', "torch.randn(2, 3, 5, 16), torch.randn(16, 24)"),
    "batched_transposed": ('torch.einsum("bqd,bkd->bqk", x, w)', "torch.randn(3, 20, 16), torch.randn(3, 24, 16)"),
    "permuted_output_relu": ('torch.relu(torch.einsum("ik,kj->ji", x, w))', "torch.randn(20, 16), torch.randn(16, 24)"),
}


@pytest.mark.parametrize("name", sorted(EINSUMS))
def test_an_einsum_reference_is_ported_by_the_matmul_template(tmp_path, name):
    body, inputs = EINSUMS[name]
    source = assert_ported(tmp_path, name, "", f"return {body}", inputs, "matmul", params="x, w")
    assert "einsum" not in source.split("class ModelNew")[1]
