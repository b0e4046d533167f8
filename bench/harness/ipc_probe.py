"""What the GPU box allows, measured before the data path is built on it.

Device memory shared through a CUDA VMM file descriptor with a child process, plain and inside
new user/PID/network/mount namespaces (util-linux ``unshare``); NVML and a Triton kernel inside
the namespaces; Triton's tensor descriptors (TMA); what torch.compile's two modes cost to compile.

    python3 bench/harness/ipc_probe.py --out $OUT       (on the GPU box; --device cpu checks logic)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CHILD = r"""
import json, os, socket, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from kernelabd.harness import shared, wire
sock = socket.socket(fileno=int(sys.argv[1]))
fds = []
head, _ = wire.recv(sock, fds)
t0 = time.perf_counter()
arena = shared.Arena.open(head["device"], fds[0], head["nbytes"])
x = arena.tensor(shared.Slot.from_json(head["slot"], arena.nbytes))
total = float(x.sum())
x.add_(1)
torch.cuda.synchronize() if head["device"] != "cpu" else None
opened_ms = (time.perf_counter() - t0) * 1000
out = {"sum": total, "open_ms": opened_ms, "pid": os.getpid()}
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    out["nvml_sm_mhz"] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
except Exception as exc:
    out["nvml_error"] = repr(exc)
if head["device"] != "cpu":
    try:
        import triton, triton.language as tl
        @triton.jit
        def k(p, n, B: tl.constexpr):
            i = tl.program_id(0) * B + tl.arange(0, B)
            tl.store(p + i, tl.load(p + i, mask=i < n) * 2, mask=i < n)
        y = torch.ones(1000, device="cuda")
        k[(4,)](y, 1000, B=256)
        out["triton_sum"] = float(y.sum())
    except Exception as exc:
        out["triton_error"] = repr(exc)[:300]
try:
    s = socket.create_connection(("127.0.0.1", int(head["port"])), timeout=2)
    out["tcp"] = "connected"
except OSError as exc:
    out["tcp"] = f"refused: {exc}"
arena.close()
wire.send(sock, out)
"""


def share(device: str, nbytes: int, wrap: list[str], port: int) -> dict:
    import torch

    from kernelabd.harness import shared, wire

    t0 = time.perf_counter()
    arena = shared.Arena.allocate(device, nbytes)
    alloc_ms = (time.perf_counter() - t0) * 1000
    layout = shared.Layout()
    slot = layout.add(torch.float32, [nbytes // 4])
    x = arena.tensor(slot)
    src = torch.ones(nbytes // 4, device=device)
    t0 = time.perf_counter()
    x.copy_(src)
    if device != "cpu":
        torch.cuda.synchronize()
    copy_s = time.perf_counter() - t0
    parent, child = socket.socketpair()
    proc = subprocess.Popen([*wrap, sys.executable, "-c", CHILD, str(child.fileno()), str(ROOT)],
                            pass_fds=(child.fileno(),))
    child.close()
    wire.send(parent, {"device": device, "nbytes": arena.nbytes, "slot": slot.to_json(), "port": port},
              fds=[arena.export()])
    parent.settimeout(120)
    reply, _ = wire.recv(parent)
    proc.wait(30)
    after = float(x.sum())
    arena.close()
    return {"wrap": " ".join(wrap) or "plain", "alloc_ms": round(alloc_ms, 2),
            "copy_GBps": round(2 * nbytes / copy_s / 1e9, 1), **reply,
            "expected_sum": nbytes // 4, "after_child_add": after}


def tma_probe() -> dict:
    import torch
    import triton
    import triton.language as tl

    out = {"triton": triton.__version__, "set_allocator": hasattr(triton, "set_allocator"),
           "make_tensor_descriptor": hasattr(tl, "make_tensor_descriptor")}
    if not out["make_tensor_descriptor"]:
        return out

    @triton.jit
    def copy_tile(a_ptr, b_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        a = tl.make_tensor_descriptor(a_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        b = tl.make_tensor_descriptor(b_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        pm, pn = tl.program_id(0), tl.program_id(1)
        b.store([pm * BM, pn * BN], a.load([pm * BM, pn * BN]) * 2)

    try:
        if out["set_allocator"]:
            triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
        b = torch.empty_like(a)
        copy_tile[(4, 4)](a, b, 256, 256, BM=64, BN=64)
        out["tma_ok"] = bool(torch.equal(b, a * 2))
    except Exception as exc:
        out["tma_error"] = repr(exc)[:400]
    return out


def compile_costs() -> dict:
    import torch

    out = {}
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for mode in ("default", "max-autotune-no-cudagraphs"):
        torch._dynamo.reset()
        fn = torch.compile(lambda a, b: torch.relu(a @ b + 1), mode=mode)
        t0 = time.perf_counter()
        fn(x, w)
        torch.cuda.synchronize()
        out[f"{mode}_compile_s"] = round(time.perf_counter() - t0, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--gib", type=float, default=8.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    facts: dict = {"unshare": shutil.which("unshare"), "bwrap": shutil.which("bwrap"),
                   "uname": os.uname().release}
    with open("/proc/sys/user/max_user_namespaces") as f:
        facts["max_user_namespaces"] = f.read().strip()
    rows = []
    nbytes = int(args.gib * (1 << 30)) if args.device != "cpu" else 1 << 24
    wraps = [[]]
    if facts["unshare"]:
        wraps.append(["unshare", "--user", "--map-root-user", "--pid", "--fork", "--kill-child",
                      "--net", "--mount", "--mount-proc"])
    for wrap in wraps:
        try:
            rows.append(share(args.device, nbytes, wrap, port))
        except Exception as exc:
            rows.append({"wrap": " ".join(wrap) or "plain", "error": repr(exc)[:500]})
    if args.device != "cpu":
        facts["tma"] = tma_probe()
        facts["compile"] = compile_costs()
    (args.out / "ipc_probe.json").write_text(json.dumps({"facts": facts, "rows": rows}, indent=1))
    print(json.dumps(facts, indent=1))
    for r in rows:
        print(json.dumps(r))


if __name__ == "__main__":
    main()
