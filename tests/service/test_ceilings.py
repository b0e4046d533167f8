"""Speed-of-light ceilings: measured on the device, and the floor they give a captured job."""

from __future__ import annotations

import pytest

from kernelabd.client import ensure_home
from kernelabd.service.ceilings import describe, floor_ms, for_job, identity, matrix_rate, measure
from kernelabd.service.recorder import LocalRecorder
from store.db import connect
from store.records import NewProblem, Store

H200ISH = {"copy_gbps": 4000.0, "fp32_tflops": 50.0, "tf32_tflops": 400.0,
           "bf16_tflops": 800.0, "fp16_tflops": 800.0}


def test_cpu_ceilings_are_measured_not_assumed():
    first = measure("cpu")
    assert first["copy_gbps"] > 0.1 and first["fp32_tflops"] > 1e-4 and first["bf16_tflops"] > 0
    assert first["device_name"] and first["torch"] and "tf32_tflops" not in first


def test_a_memory_bound_floor_is_its_bytes_at_copy_bandwidth():
    capture = {"min_bytes": 8 * 2 ** 30, "flops": 0, "dtype": "torch.float32"}
    floor = floor_ms(capture, H200ISH)
    assert floor["bound"] == "memory" and floor["ms"] == pytest.approx(8 * 2 ** 30 / 4e12 * 1e3)


def test_a_matmul_floor_uses_the_rate_of_its_dtype_and_tf32_only_when_allowed():
    n = 8192
    capture = {"min_bytes": 3 * n * n * 2, "flops": 2 * n ** 3, "dtype": "torch.bfloat16"}
    floor = floor_ms(capture, H200ISH)
    assert floor["bound"] == "compute" and floor["ms"] == pytest.approx(2 * n ** 3 / 800e12 * 1e3)
    fp32 = {**capture, "dtype": "torch.float32", "min_bytes": 3 * n * n * 4}
    assert floor_ms(fp32, H200ISH)["ms"] == pytest.approx(2 * n ** 3 / (400e12 / 3) * 1e3), \
        "fp32-accurate at three TF32 products beats the FMA units' 50"
    no_tensor_cores = {k: v for k, v in H200ISH.items() if k != "tf32_tflops"}
    assert floor_ms(fp32, no_tensor_cores)["ms"] == pytest.approx(2 * n ** 3 / 50e12 * 1e3)
    assert floor_ms(fp32, H200ISH, tf32=True)["ms"] == pytest.approx(2 * n ** 3 / 400e12 * 1e3)
    assert matrix_rate({"fp32_tflops": 50.0}, "torch.float32", tf32=True) == 50.0, \
        "no TF32 figure (a CPU): the fp32 rate"


def test_no_floor_without_the_figures():
    assert floor_ms({"flops": 10}, H200ISH) is None
    assert floor_ms({"min_bytes": 10, "flops": 0}, {}) is None


def test_described_for_people():
    assert describe({"device_name": "NVIDIA H200", **H200ISH}) == \
        "NVIDIA H200: copy 4000 GB/s; TFLOP/s bf16 800, fp16 800, tf32 400, fp32 50"


@pytest.mark.gpu
def test_gpu_ceilings_are_plausible_for_a_datacenter_gpu():
    """Only kernels run: no clock, power or other device setting is read or changed."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    c = measure("cuda")
    assert 100 < c["copy_gbps"] < 10_000
    assert c["bf16_tflops"] > c["tf32_tflops"] >= c["fp32_tflops"] * 0.9 > 0


def test_ceilings_are_measured_once_per_device_driver_and_clocks_in_a_home(home):
    """As ``kernelab port`` runs jobs: no registered device row. A second job on the same
    device, driver and clock settings reuses the first one's ceilings; other clock settings
    measure them again."""
    ensure_home(home)
    store = Store(connect(home.db))
    rec = LocalRecorder(store, home)
    jobs = [store.add_problem(NewProblem(f"p{i}", "x", "print()\n"))[1] for i in range(3)]
    lines: list[str] = []
    first = for_job(rec, jobs[0], "cpu", "off", lines.append)
    assert first["copy_gbps"] > 0 and lines == ["measuring this device's ceilings (once per device, driver and clocks)"]
    assert for_job(rec, jobs[1], "cpu", "off", lines.append) == first and len(lines) == 1, "not measured twice"
    other = for_job(rec, jobs[2], "cpu", "base", lines.append)
    assert len(lines) == 2 and other["measured_at"] > first["measured_at"]
    measured = store.conn.execute("SELECT job_id, message FROM events WHERE kind = 'ceilings.measured'").fetchall()
    assert [m["job_id"] for m in measured] == [jobs[0], jobs[2]]
    keys = [r[0] for r in store.conn.execute("SELECT key FROM ceilings ORDER BY measured_at")]
    assert keys == [identity("cpu", "off").key, identity("cpu", "base").key]
    assert keys[0].startswith("cpu ") and "|torch " in keys[0] and keys[0].endswith("lock_clocks off")


def test_a_device_that_cannot_be_measured_leaves_the_job_without_a_floor(home):
    ensure_home(home)
    store = Store(connect(home.db))
    (_, job_id) = store.add_problem(NewProblem("p", "x", "print()\n"))
    assert for_job(LocalRecorder(store, home), job_id, "cuda:7", "off", lambda _: None) is None
    (event,) = store.conn.execute("SELECT level, message FROM events WHERE kind = 'ceilings.failed'").fetchall()
    assert event["level"] == "warning" and event["message"]
