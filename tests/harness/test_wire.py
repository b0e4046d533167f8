"""The sandbox wire format: exact round trips, and refusal of anything malformed."""

from __future__ import annotations

import json
import socket
import struct

import pytest
import torch

from kernelabd.harness import wire


def roundtrip(header: dict, tensors: list[torch.Tensor]) -> tuple[dict, list[torch.Tensor]]:
    a, b = socket.socketpair()
    with a, b:
        wire.send(a, header, tensors)
        return wire.recv(b)


@pytest.mark.parametrize("dtype", list(wire.DTYPES.values()))
def test_tensors_round_trip_bit_exactly(dtype: torch.dtype) -> None:
    t = (torch.randn(3, 5) * 100).to(dtype)
    header, [back] = roundtrip({"k": 1}, [t.t()])     # non-contiguous on the way in
    assert header["k"] == 1
    assert back.dtype == dtype and back.shape == t.t().shape
    assert torch.equal(back, t.t())
    assert back.is_contiguous() and type(back) is torch.Tensor


def test_subclass_arrives_as_plain_tensor() -> None:
    class Sneaky(torch.Tensor):
        pass

    _, [back] = roundtrip({}, [torch.ones(4).as_subclass(Sneaky)])
    assert type(back) is torch.Tensor


def _raw(sock: socket.socket, head: bytes, payload: bytes = b"") -> None:
    sock.sendall(struct.pack("<QQ", len(head), len(payload)) + head + payload)


@pytest.mark.parametrize("head,payload", [
    (b"not json", b""),
    (b"[1, 2]", b""),
    (json.dumps({"tensors": [{"dtype": "object", "shape": [1], "nbytes": 8}]}).encode(), b"x" * 8),
    (json.dumps({"tensors": [{"dtype": "float32", "shape": [4], "nbytes": 16}]}).encode(), b"x" * 8),
    (json.dumps({"tensors": [{"dtype": "float32", "shape": [-1], "nbytes": 4}]}).encode(), b"x" * 4),
])
def test_malformed_messages_raise_protocol_error(head: bytes, payload: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        _raw(a, head, payload)
        with pytest.raises(wire.ProtocolError):
            wire.recv(b)


def test_hang_up_is_a_protocol_error() -> None:
    a, b = socket.socketpair()
    with b:
        a.close()
        with pytest.raises(wire.ProtocolError):
            wire.recv(b)


def test_pickle_bytes_are_never_unpickled() -> None:
    import pickle

    a, b = socket.socketpair()
    with a, b:
        _raw(a, pickle.dumps({"verdict": "pass"}))
        with pytest.raises(wire.ProtocolError):
            wire.recv(b)
