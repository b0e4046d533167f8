"""A real chat-completions server on loopback for agent tests, answering from a script.

Each request takes the next step of the script (the last one repeats): an answer (streamed as
server-sent events or as one JSON object), an HTTP status, or an answer after a delay. Every
request's body and headers are kept, so tests can check what an agent was shown and sent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Step:
    text: str = ""
    status: int = 200
    delay_s: float = 0.0
    stream: bool = True
    headers: tuple[tuple[str, str], ...] = ()


def answer(edit: str, source: str) -> Step:
    """A well-formed answer: the EDIT line and the whole file in one code block."""
    return Step(text=f"EDIT: {edit}\n```python\n{source}\n```")


class ChatServer:
    """``/v1/chat/completions`` on 127.0.0.1, on an ephemeral port, in a thread."""

    def __init__(self, script: list[Step]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append({"path": self.path, "body": body,
                                        "headers": dict(self.headers)})
                step = server.script[min(len(server.requests), len(server.script)) - 1]
                time.sleep(step.delay_s)
                try:
                    server.reply(self, step, body)
                except (BrokenPipeError, ConnectionResetError):
                    return          # the client gave up (a timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @staticmethod
    def reply(handler: BaseHTTPRequestHandler, step: Step, body: dict[str, Any]) -> None:
        usage = {"prompt_tokens": 100, "completion_tokens": max(len(step.text) // 4, 1)}
        if step.status != 200:
            payload = json.dumps({"error": {"message": f"scripted {step.status}"}}).encode()
            handler.send_response(step.status)
            for key, value in step.headers:
                handler.send_header(key, value)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        elif body.get("stream") and step.stream:
            handler.send_response(200)
            handler.send_header("Content-Type", "text/event-stream")
            handler.end_headers()
            pieces = [step.text[i:i + 200] for i in range(0, len(step.text), 200)] or [""]
            for piece in pieces:
                chunk = {"model": body["model"], "choices": [{"delta": {"content": piece}}]}
                handler.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            end = {"model": body["model"], "choices": [{"delta": {}, "finish_reason": "stop"}]}
            handler.wfile.write(f"data: {json.dumps(end)}\n\n".encode())
            handler.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
            handler.wfile.write(b"data: [DONE]\n\n")
        else:
            payload = json.dumps({"model": body["model"], "usage": usage, "choices": [
                {"message": {"role": "assistant", "content": step.text},
                 "finish_reason": "stop"}]}).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
