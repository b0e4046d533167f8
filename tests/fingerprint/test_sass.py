"""Reading the instruction mix and ptxas's figures, on text in the tools' own formats."""

from __future__ import annotations

from kernelabd.fingerprint import KernelPrint, differences, render_pair
from kernelabd.fingerprint.sass import instruction_mix, ptxas_figures

SASS = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;              /* 0x00000a00ff017b82 */
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;    /* 0x0000000402047981 */
        /*0020*/              @!P0 LDG.E R8, desc[UR4][R2.64] ;        /* 0x0000000402087981 */
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0040*/                   FFMA R7, R2, R2, R7 ;
        /*0050*/                   STS.U16 [R3], R2 ;
        /*0060*/                   UTMALDG.2D [UR8], [UR4] ;
        /*0070*/                   SYNCS.ARRIVE.TRANS64.RED.A1T0 RZ, [UR4+0x8], RZ ;
        /*0080*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0090*/                   NOP;
"""

PTXAS = """ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     24 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem
"""


def test_instruction_mix_counts_by_kind_and_width() -> None:
    mix = instruction_mix(SASS)
    assert mix == {"LDG.128": 1, "LDG.32": 1, "HGMMA": 1, "FFMA": 1, "STS.16": 1, "UTMALDG": 1,
                   "SYNCS": 1, "BAR": 1, "total": 9}


def test_ptxas_figures() -> None:
    assert ptxas_figures(PTXAS) == {"k": {"spills": 16, "spill_loads": 12, "smem": 4096}}


def _print(name: str, registers: int, **instructions: int) -> KernelPrint:
    return KernelPrint(name=name, arch="sm_90", registers=registers, spills=0, spill_loads=0,
                       local_bytes=0, shared_bytes=0, static_shared_bytes=0,
                       instructions=instructions)


def test_differences_name_each_changed_figure_and_pair_renamed_kernels() -> None:
    a = [_print("gemm_fma", 255, FFMA=4096, total=5000)]
    b = [_print("gemm_tc", 110, HGMMA=4, total=500)]
    found = {d["figure"]: (d["a"], d["b"]) for d in differences(a, b)}
    assert found == {"registers": (255, 110), "FFMA": (4096, 0), "HGMMA": (0, 4),
                     "total": (5000, 500)}
    text = render_pair(a, b, "fma.py", "tc.py")
    marked = {line.split()[0] for line in text.splitlines() if line.endswith("◀")}
    assert marked == {"name", "registers", "FFMA", "HGMMA", "total"}
