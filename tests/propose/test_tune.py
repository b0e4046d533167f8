"""The tune proposer: one declared tunable per edit, every other byte kept, nothing repeated."""

from __future__ import annotations

import pytest

from kernelabd.propose.base import (
    Batch,
    Budget,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    ProposerUnavailable,
    Screened,
    load_proposer,
)
from kernelabd.propose.tune import (
    STALL_BATCHES,
    Target,
    TunablesError,
    TuneProposer,
    apply_edit,
    describe_change,
    fits,
    parse_tunables,
    signature,
    with_params,
)

SOURCE = '''"""kernel"""
TUNABLES = {"BLOCK_SIZE": [128, 256, 512, 1024], "num_warps": [1, 2, 4, 8]}
BLOCK_SIZE = 256  # rows per program
num_warps = 4
other = 256
'''


def ctx(*history: Candidate) -> JobContext:
    return JobContext(job_id=1, problem="p", reference_source="", device="cpu",
                      budget=Budget(10, 60.0), history=tuple(history))


def incumbent(source: str = SOURCE, cid: int = 1) -> Candidate:
    return Candidate(id=cid, proposer="start", source=source, state="done", verdict="pass",
                     accepted=True, params={t.name: t.current for t in parse_tunables(source)})


def test_parse_reads_declaration_and_current_values():
    tunables = parse_tunables(SOURCE)
    assert [(t.name, t.current, t.values) for t in tunables] == [
        ("BLOCK_SIZE", 256, (128, 256, 512, 1024)), ("num_warps", 4, (1, 2, 4, 8))]


def test_edit_changes_exactly_one_assignment():
    block = parse_tunables(SOURCE)[0]
    edited = apply_edit(SOURCE, block, 512)
    before, after = SOURCE.splitlines(), edited.splitlines()
    assert [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b] == [2]
    assert after[2] == "BLOCK_SIZE = 512  # rows per program"
    assert parse_tunables(edited)[0].current == 512


def test_proposals_are_single_edits_of_the_incumbent_neighbours_first():
    inc = incumbent()
    proposal = TuneProposer().propose(ctx(inc))
    assert isinstance(proposal, Proposal)
    assert (proposal.parent_id, proposal.edit) == (1, "BLOCK_SIZE 256 → 512")
    assert proposal.params == {"BLOCK_SIZE": 512, "num_warps": 4}


def test_descent_visits_every_single_edit_once_then_stops():
    inc = incumbent()
    history = [inc]
    edits = []
    while isinstance(p := TuneProposer().propose(ctx(*history)), Proposal):
        edits.append(p.edit)
        history.append(Candidate(id=len(history) + 1, proposer="tune", source=p.source,
                                 parent_id=p.parent_id, params=p.params, state="done",
                                 verdict="pass"))
    assert edits == ["BLOCK_SIZE 256 → 512", "BLOCK_SIZE 256 → 128", "num_warps 4 → 8",
                     "num_warps 4 → 2", "BLOCK_SIZE 256 → 1024", "num_warps 4 → 1"]


def test_descent_moves_on_from_a_new_incumbent_without_repeating():
    inc = incumbent()
    better = incumbent(apply_edit(SOURCE, parse_tunables(SOURCE)[0], 512), cid=2)
    proposal = TuneProposer().propose(ctx(inc, better))
    assert isinstance(proposal, Proposal) and proposal.parent_id == 2
    # 256 was the old incumbent's value: already measured, so the next step is 1024.
    assert proposal.edit == "BLOCK_SIZE 512 → 1024"


def test_no_incumbent_or_no_tunables_means_nothing_to_propose():
    assert TuneProposer().propose(ctx()) == Decline()
    assert TuneProposer().propose(ctx(incumbent("class ModelNew: pass\n"))) == Decline()


def test_the_shipped_example_is_tunable(kit):
    source = (kit.examples / "softmax.new.py").read_text()
    assert parse_tunables(source), "examples/softmax.new.py declares TUNABLES"
    assert isinstance(TuneProposer().propose(ctx(incumbent(source))), Proposal)


@pytest.mark.parametrize("source, message", [
    ("TUNABLES = {'B': [1, 2]}\n", "no module-level assignment"),
    ("TUNABLES = {'B': []}\nB = 1\n", "non-empty list"),
    ("TUNABLES = make()\n", "literal dict"),
    ("TUNABLES = {'B': [1]}\nB = f()\n", "literal"),
])
def test_malformed_declarations_are_explained(source, message):
    with pytest.raises(TunablesError, match=message):
        parse_tunables(source)


def test_configurations_that_cannot_launch_are_pruned():
    assert fits({"num_warps": 8, "num_stages": 3})
    assert not fits({"num_warps": 3})
    assert not fits({"num_warps": 64})
    assert not fits({"num_stages": 0})


MATMUL = {"smem": [["BLOCK_M", "BLOCK_K"], ["BLOCK_K", "BLOCK_N"]], "acc": [["BLOCK_M", "BLOCK_N"]]}
H200_FP32, H200_BF16 = Target(gpu=True, elem_bytes=4), Target(gpu=True, elem_bytes=2)


def test_tiles_that_overflow_shared_memory_or_spill_are_pruned_on_a_gpu_only():
    big = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 3}
    assert fits(big, MATMUL, H200_FP32), "3 × 64 KiB of fp32 tiles fit in 227 KiB"
    assert not fits({**big, "num_stages": 4}, MATMUL, H200_FP32), "4 × 64 KiB do not"
    assert fits({**big, "num_stages": 4}, MATMUL, H200_BF16), "half-size elements: 4 × 32 KiB do"
    assert not fits({**big, "num_warps": 2}, MATMUL, H200_FP32), "256 accumulator registers a thread"
    assert fits({**big, "num_stages": 4, "num_warps": 2}, MATMUL, Target()), \
        "the CPU interpreter has neither limit"
    assert fits({**big, "num_stages": 4}, None, H200_FP32), "nothing declared: launch limits only"


def test_fp32_dots_without_tf32_get_half_the_accumulator_registers():
    """128 accumulators a thread fit tensor-core dots but spill fp32 FMA dots (ptxas, sm_90:
    bench/port/sm90.py --grid); a template says which dots it runs in RESOURCES."""
    tile = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2}
    ieee, tf32 = {**MATMUL, "dots": "ieee"}, {**MATMUL, "dots": "tf32"}
    assert not fits(tile, ieee, H200_FP32)
    assert fits({**tile, "num_warps": 8}, ieee, H200_FP32), "64 a thread at 8 warps"
    assert fits(tile, tf32, H200_FP32), "TF32 dots run on tensor cores"
    assert fits(tile, ieee, H200_BF16), "bf16 operands take the tensor cores whatever the precision"
    x3 = {**MATMUL, "dots": "tf32x3"}
    assert not fits(tile, x3, H200_FP32), "3xTF32 holds each operand's head and tail: it spilled"
    assert fits({**tile, "num_warps": 8}, x3, H200_FP32), "the template's fp32 seed (212-251 registers)"


def test_declared_register_tiles_count_beside_the_accumulators():
    conv = {**MATMUL, "regs": [["BLOCK_M", "BLOCK_K"]], "dots": "ieee"}
    tile = {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4, "num_stages": 2}
    assert fits(tile, {**MATMUL, "dots": "ieee"}, H200_FP32), "64 accumulators a thread"
    assert not fits(tile, conv, H200_FP32), "64 + 32 gathered addresses"
    assert fits({**tile, "BLOCK_N": 64}, conv, H200_FP32), "32 + 32"


def test_templates_declare_their_dots_for_the_register_limit():
    from kernelabd.propose.templates import common, conv, matmul
    assert common.resources(matmul.RESOURCES, "ieee")["dots"] == "ieee"
    assert common.resources(conv.RESOURCES, "tf32") == {**conv.RESOURCES, "dots": "tf32"}
    assert ["BLOCK_M", "BLOCK_K"] in conv.RESOURCES["regs"]


def test_the_tuner_skips_what_cannot_fit_and_proposes_the_next_move():
    from kernelabd.propose.templates.common import tunables
    source = '"""k"""' + tunables({"num_stages": [3, 4], "BLOCK_M": [64, 128], "BLOCK_N": [128],
                                    "BLOCK_K": [64], "num_warps": [4]},
                                   {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_stages": 3,
                                    "num_warps": 4}, MATMUL)
    on_gpu = JobContext(job_id=1, problem="p", reference_source="", device="cuda", budget=Budget(10, 60.0),
                        capture={"dtype": "torch.float32"}, history=(incumbent(source),))
    assert TuneProposer().propose(on_gpu).edit == "BLOCK_M 128 → 64", "num_stages 4 would not fit"
    on_cpu = JobContext(job_id=1, problem="p", reference_source="", device="cpu", budget=Budget(10, 60.0),
                        history=(incumbent(source),))
    assert TuneProposer().propose(on_cpu).edit == "num_stages 3 → 4"


def test_unknown_proposers_are_reported_not_crashed_on():
    assert load_proposer("tune").name == "tune"
    with pytest.raises(ProposerUnavailable, match="unknown proposer"):
        load_proposer("nonesuch")


# -- screened batches -------------------------------------------------------------------------

SEARCHED = '''"""kernel"""
TUNABLES = {"BLOCK_SIZE": [128, 256, 512, 1024], "num_warps": [1, 2, 4, 8], "STAGES": [1, 2, 3]}
STARTS = [{"BLOCK_SIZE": 1024, "num_warps": 8}]
BLOCK_SIZE = 256
num_warps = 4
STAGES = 1
'''


def screening(*history: Candidate, screened=(), cached=(), batch: int = 8, job_id: int = 1) -> JobContext:
    return JobContext(job_id=job_id, problem="p", reference_source="", device="cuda",
                      budget=Budget(10, 60.0), history=tuple(history), screened=tuple(screened),
                      cached=tuple(cached), screen_batch=batch)


def rows_for(batch: Batch, ms: dict[tuple, float], start_id: int = 1) -> list[Screened]:
    """The batch as the loop would record it: the control first, then each configuration."""
    configs = [batch_control(batch), *batch.configs]
    return [Screened(id=start_id + i, parent_id=batch.parent_id, params=p, status="timed",
                     ms=ms.get((p["BLOCK_SIZE"], p["num_warps"]), 1.0)) for i, p in enumerate(configs)]


def batch_control(batch: Batch) -> dict:
    return {t.name: t.current for t in parse_tunables(batch.source)}


def test_a_job_that_can_screen_gets_a_batch_starting_from_the_cache_then_known_good_then_neighbours():
    inc = incumbent(SEARCHED)
    cached = ({"params": {"BLOCK_SIZE": 512, "num_warps": 2, "STAGES": 3}, "exact": True},
              {"params": {"BLOCK_SIZE": 128}, "exact": False})
    batch = TuneProposer().propose(screening(inc, cached=cached))
    assert isinstance(batch, Batch) and batch.parent_id == 1 and batch.source == SEARCHED
    assert list(batch.configs[:3]) == [
        {"BLOCK_SIZE": 512, "num_warps": 2, "STAGES": 3},
        {"BLOCK_SIZE": 128, "num_warps": 4, "STAGES": 1},        # a partial entry over the incumbent's
        {"BLOCK_SIZE": 1024, "num_warps": 8, "STAGES": 1}]       # the candidate's STARTS
    neighbours = [{"BLOCK_SIZE": 512, "num_warps": 4, "STAGES": 1}, {"BLOCK_SIZE": 256, "num_warps": 8, "STAGES": 1},
                  {"BLOCK_SIZE": 256, "num_warps": 2, "STAGES": 1}, {"BLOCK_SIZE": 256, "num_warps": 4, "STAGES": 2}]
    assert list(batch.configs[3:7]) == neighbours, "the 128 neighbour came from the cache already"
    assert len(batch.configs) == 8
    assert len({tuple(sorted(c.items())) for c in batch.configs}) == 8
    assert {"BLOCK_SIZE": 256, "num_warps": 4, "STAGES": 1} not in batch.configs, "the control is the loop's"


def test_later_batches_are_fitted_to_what_was_screened_and_never_repeat_it():
    inc = incumbent(SEARCHED)
    first = TuneProposer().propose(screening(inc, batch=12))
    # Large blocks with many warps were fast: the model should lean there.
    fast = {(b, w): 0.2 for b in (512, 1024) for w in (4, 8)}
    rows = rows_for(first, fast)
    second = TuneProposer().propose(screening(inc, screened=rows, batch=12))
    assert isinstance(second, Batch)
    seen = {tuple(sorted(r.params.items())) for r in rows}
    assert not seen & {tuple(sorted(c.items())) for c in second.configs}, "nothing screened is screened again"
    again = TuneProposer().propose(screening(inc, screened=rows, batch=12))
    assert again == second, "rebuilt from the same rows, the study suggests the same batch (kill -9 safe)"
    leaning = sum(c["BLOCK_SIZE"] >= 512 for c in second.configs)
    assert leaning >= 0.75 * len(second.configs), f"TPE follows the fast region: {second.configs}"


def test_a_batch_leaves_out_what_cannot_fit_on_the_gpu():
    from kernelabd.propose.templates.common import tunables
    source = '"""k"""' + tunables({"num_stages": [3, 4], "BLOCK_M": [64, 128], "BLOCK_N": [128],
                                    "BLOCK_K": [64], "num_warps": [4]},
                                   {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "num_stages": 3,
                                    "num_warps": 4}, MATMUL)
    on_gpu = JobContext(job_id=1, problem="p", reference_source="", device="cuda", budget=Budget(10, 60.0),
                        capture={"dtype": "torch.float32"}, history=(incumbent(source),), screen_batch=8)
    batch = TuneProposer().propose(on_gpu)
    assert all(fits(c, MATMUL, Target(gpu=True)) for c in batch.configs)
    assert {"num_stages": 4, "BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "num_warps": 4} not in batch.configs


def test_an_incumbent_is_left_after_its_batches_and_a_broken_screen_falls_back_to_single_edits():
    inc = incumbent(SEARCHED)
    control = {"BLOCK_SIZE": 256, "num_warps": 4, "STAGES": 1}
    stalled = [Screened(id=i, parent_id=1, params=control, status="timed", ms=1.0) for i in range(STALL_BATCHES)]
    assert TuneProposer().propose(screening(inc, screened=stalled)) == Decline()
    broken = [Screened(id=1, parent_id=1, params=control, status="failed")]
    fallback = TuneProposer().propose(screening(inc, screened=broken))
    assert isinstance(fallback, Proposal) and fallback.edit == "BLOCK_SIZE 256 → 512"


def test_where_screening_is_not_possible_the_tuner_changes_one_tunable():
    inc = incumbent(SEARCHED)
    assert isinstance(TuneProposer().propose(screening(inc, batch=0)), Proposal)
    cuda = Candidate(id=1, proposer="start", source=SEARCHED, state="done", verdict="pass", accepted=True,
                     language="cuda")
    assert isinstance(TuneProposer().propose(screening(cuda)), Proposal)


def test_a_signature_names_the_kernel_whatever_its_configuration():
    other = with_params(SEARCHED, {"BLOCK_SIZE": 1024, "num_warps": 1})
    assert other != SEARCHED and parse_tunables(other)[0].current == 1024
    assert signature(other) == signature(SEARCHED)
    assert signature(SEARCHED).startswith("BLOCK_SIZE,STAGES,num_warps@")
    assert signature(SEARCHED.replace('"""kernel"""', '"""another kernel"""')) != signature(SEARCHED)
    assert describe_change({"BLOCK_SIZE": 256, "num_warps": 4}, {"BLOCK_SIZE": 512, "num_warps": 4}) == \
        "BLOCK_SIZE 256 → 512"
