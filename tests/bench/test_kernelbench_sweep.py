"""The KernelBench sweep spread over several commands: what a later command still has to run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.kernelbench.sweep import done_in, latest, table

CROWDED = ("needs 72.4 GiB of GPU memory for the least the gate keeps (…); the device has 78.7 GiB "
           "free (66.9 GiB usable)")


def rows_file(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_later_command_runs_what_was_cut_or_crowded_out_and_nothing_else(tmp_path):
    path = rows_file(tmp_path, [
        {"problem": "level1/19_ReLU", "outcome": "ok", "wall_s": 20.4, "beside": 6},
        {"problem": "level1/20_LeakyReLU", "outcome": "refused", "reason": CROWDED, "beside": 6},
        {"problem": "level1/21_Sigmoid", "outcome": "refused", "reason": CROWDED, "beside": 0},
        {"problem": "level2/80_Gemm", "outcome": "refused", "reason": "reference outputs are near zero", "beside": 3},
        {"problem": "level1/22_Tanh", "outcome": "not run (deadline)"},
    ])
    assert done_in([path]) == {"level1/19_ReLU", "level1/21_Sigmoid", "level2/80_Gemm"}, (
        "a memory refusal counts only when the problem ran alone; a gate refusal counts wherever it ran")


def test_the_last_row_of_a_problem_is_its_result_and_a_cut_one_never_hides_it(tmp_path):
    first = rows_file(tmp_path, [{"problem": "level1/20_LeakyReLU", "outcome": "refused", "reason": CROWDED}])
    second = tmp_path / "second.jsonl"
    second.write_text(json.dumps({"problem": "level1/20_LeakyReLU", "outcome": "ok", "beside": 0}) + "\n"
                      + json.dumps({"problem": "level1/20_LeakyReLU", "outcome": "not run (deadline)"}) + "\n")
    (row,) = latest([first, second])
    assert row["outcome"] == "ok"
    assert "| level1/20_LeakyReLU | ok |" in table([row])


def test_a_result_counts_whichever_file_it_is_in(tmp_path):
    """A glob lists ``rows-call4.jsonl`` before ``rows.jsonl``: the alone rerun that settled a
    crowded-out refusal must count before and after it, for ``--skip`` and ``--report``."""
    crowded = rows_file(tmp_path, [{"problem": "level1/20_LeakyReLU", "outcome": "refused", "reason": CROWDED,
                                    "beside": 6}])
    alone = tmp_path / "rows-call4.jsonl"
    alone.write_text(json.dumps({"problem": "level1/20_LeakyReLU", "outcome": "ok", "beside": 0}) + "\n")
    for order in ([alone, crowded], [crowded, alone]):
        assert done_in(order) == {"level1/20_LeakyReLU"}
        assert [r["outcome"] for r in latest(order)] == ["ok"]
