"""``triu``/``tril`` of a product as the matmul template's epilogue: each element kept or zeroed
by its row and column in the output tile, and a tile that is zeroed whole skips its K loop. Each
passes the real gate on CPU (Triton interpreter) at sizes of several tiles, so that whole tiles
are skipped; where no kernel knows an element's row and column (a flat elementwise chain, a
product whose rows are flattened batch rows) the op is declined, never applied to a flat index."""

from __future__ import annotations

import pytest

from kernelabd.propose.template.proposer import instantiate
from tests.propose.test_template import assert_ported, reference

# name -> (forward body, inputs, the op the matmul's epilogue names)
TRIANGULAR = {
    "triu_of_product": ("torch.triu(torch.matmul(x, w))", "torch.randn(300, 40), torch.randn(40, 290)", "triu"),
    "tril_below_the_diagonal": ("torch.tril(x @ w, diagonal=-2)", "torch.randn(290, 40), torch.randn(40, 300)",
                                "tril"),
    "triu_then_relu": ("torch.relu(torch.triu(x @ w, 1) * 2.0)", "torch.randn(300, 24), torch.randn(24, 280)",
                       "triu"),
    "batched_tril": ("torch.bmm(x, w).tril()", "torch.randn(2, 200, 24), torch.randn(2, 24, 260)", "tril"),
}


@pytest.mark.parametrize("name", sorted(TRIANGULAR))
def test_a_triangular_product_is_ported_and_passes_the_gate(tmp_path, name):
    body, inputs, op = TRIANGULAR[name]
    source = assert_ported(tmp_path, name, "", f"return {body}", inputs, f"+ {op}", params="x, w")
    assert ("k_hi = k_lo" in source) == (name != "triu_then_relu")   # zeroed tiles skip the product


@pytest.mark.parametrize("body", ["torch.triu(x * 2.0 + w)", "torch.triu(torch.matmul(x, w))"])
def test_no_template_applies_a_triangle_to_a_flat_index(body):
    """An elementwise chain, and a product of a 3-D ``x`` by a matrix (its rows flattened across
    the batch), know no element's row and column."""
    inputs = "torch.randn(3, 30, 30), torch.randn(30, 30)"
    found = instantiate(reference(f"def forward(self, x, w):\n    return {body}\n", inputs=inputs))
    assert found is None, found.edit
