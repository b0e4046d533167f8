"""The message format between trusted code and sandbox processes.

A message is a JSON header plus raw tensor bytes, length-prefixed, over a socket. There is
deliberately no pickle anywhere on the way back from a sandbox: unpickling bytes written by a
candidate would hand it code execution inside the process that computes the verdict. Tensors
travel as (dtype, shape, bytes) and are rebuilt as fresh, plain, contiguous tensors, so nothing a
candidate returns can be a subclass, a lazy object or a view of memory it still controls.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

import torch

MAX_HEADER = 16 << 20          # a header larger than this is a protocol violation
MAX_PAYLOAD = 64 << 30
MAX_FDS = 16                   # file descriptors one message may carry (shared arenas)

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32,
    "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class ProtocolError(RuntimeError):
    """The peer sent something that is not a well-formed message (or hung up)."""


def _tensor_view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without another copy (one device-to-host copy at most)."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")


def encode(header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> list[bytes | memoryview]:
    """Serialise a header and tensors into the chunks to send; the header gains a ``tensors``
    index. Large tensors go out as views of their own memory."""
    tensors = tensors or []
    views = [_tensor_view(t) for t in tensors]
    header = dict(header)
    header["tensors"] = [
        {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape), "nbytes": v.nbytes}
        for t, v in zip(tensors, views, strict=True)
    ]
    head = json.dumps(header).encode()
    chunks: list[bytes | memoryview] = []
    for v in views:
        chunks += [v, b"\0" * _pad(v.nbytes)]
    payload_len = sum(len(c) if isinstance(c, bytes) else c.nbytes for c in chunks)
    return [struct.pack("<QQ", len(head), payload_len) + head, *chunks]


def _pad(nbytes: int) -> int:
    """Each tensor starts 8-byte aligned in the payload, so it can be used in place."""
    return -nbytes % 8


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ProtocolError("peer closed the connection")
        got += k
    return buf


def _decode_tensor(meta: Any, payload: bytearray, offset: int) -> tuple[torch.Tensor, int]:
    if not isinstance(meta, dict) or meta.get("dtype") not in DTYPES:
        raise ProtocolError(f"bad tensor descriptor {meta!r:.200}")
    shape = meta.get("shape")
    nbytes = meta.get("nbytes")
    if not (isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)):
        raise ProtocolError("bad tensor shape")
    dtype = DTYPES[meta["dtype"]]
    numel = 1
    for s in shape:
        numel *= s
    itemsize = torch.empty((), dtype=dtype).element_size()
    if nbytes != numel * itemsize or offset + nbytes > len(payload):
        raise ProtocolError("tensor size does not match its descriptor")
    if numel == 0:
        return torch.empty(shape, dtype=dtype), offset
    wire_dtype = torch.int16 if dtype == torch.bfloat16 else dtype
    flat = torch.frombuffer(payload, dtype=wire_dtype, count=numel, offset=offset)
    if dtype == torch.bfloat16:
        flat = flat.view(torch.bfloat16)
    # Shares the received buffer (kept alive by the tensor): no copy of large outputs.
    return flat.reshape(shape), offset + nbytes + _pad(nbytes)


def _recv_prefix(sock: socket.socket, fds: list[int]) -> bytes:
    """The 16-byte length prefix, and the descriptors that travel with the message's first bytes."""
    data, got, _flags, _addr = socket.recv_fds(sock, 16, MAX_FDS)
    fds.extend(got)
    if not data:
        raise ProtocolError("peer closed the connection")
    return data + bytes(_recv_exact(sock, 16 - len(data))) if len(data) < 16 else data


def recv(sock: socket.socket, fds: list[int] | None = None) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """Read one message; anything malformed raises ``ProtocolError``. Descriptors that came with
    it are appended to ``fds`` (the caller owns them); without ``fds`` any are closed at once."""
    received: list[int] = []
    try:
        prefix = _recv_prefix(sock, received)
    finally:
        if fds is None:
            for fd in received:
                os.close(fd)
        else:
            fds.extend(received)
    head_len, payload_len = struct.unpack("<QQ", prefix)
    if head_len > MAX_HEADER or payload_len > MAX_PAYLOAD:
        raise ProtocolError("message too large")
    try:
        header = json.loads(bytes(_recv_exact(sock, head_len)))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("tensors", []), list):
        raise ProtocolError("header is not an object")
    payload = _recv_exact(sock, payload_len)
    tensors = []
    offset = 0
    for meta in header.get("tensors", []):
        t, offset = _decode_tensor(meta, payload, offset)
        tensors.append(t)
    return header, tensors


def send(sock: socket.socket, header: dict[str, Any],
         tensors: list[torch.Tensor] | None = None, fds: list[int] | None = None) -> None:
    """Send one message; ``fds`` (arena descriptors) travel with its first bytes."""
    first, *rest = encode(header, tensors)
    if fds:
        sent = socket.send_fds(sock, [first], list(fds))
        first = first[sent:]
    sock.sendall(first)
    for chunk in rest:
        sock.sendall(chunk)
