"""Every call the convergence loop makes on its recorder reaches the daemon from a worker: the
worker's ``RpcRecorder`` has it, the daemon's ``LocalRecorder`` answers it, and the daemon's
allow-list (``RPC_METHODS``) lets it through, so a job that screens runs the same under the
daemon, on a Ray node and in ``kernelab port``."""

from __future__ import annotations

from kernelabd.service.converge import Recorder
from kernelabd.service.recorder import RPC_METHODS, LocalRecorder
from kernelabd.service.worker import RpcRecorder


def protocol_methods() -> set[str]:
    return {name for name in vars(Recorder) if not name.startswith("_")}


def test_every_recorder_call_of_the_loop_is_forwarded_and_allowed():
    missing = {m for m in protocol_methods() if not callable(getattr(RpcRecorder, m, None))}
    assert not missing, f"the worker's recorder lacks {sorted(missing)}"
    assert protocol_methods() <= RPC_METHODS, f"not allowed over the pipe: {sorted(protocol_methods() - RPC_METHODS)}"
    assert all(callable(getattr(LocalRecorder, m, None)) for m in RPC_METHODS)
