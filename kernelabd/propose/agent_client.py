"""Talking to an agent: an OpenAI-compatible chat-completions endpoint over httpx, or a
command-line agent run in a fresh work directory.

Both return an ``Answer``: the text (or ``None``) and every exchange as the row the store keeps
(``store.exchanges.FIELDS``), failed attempts included, so that a 429 followed by a success
leaves two rows and a timeout leaves one with its reason. Nothing here raises on a bad answer:
a model that misbehaves is a recorded failed proposal, never a crashed job.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kernelabd.config import AgentConfig

RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
BACKOFF_S = 0.5            # first wait after a 429/5xx; doubled per retry …
BACKOFF_MAX_S = 30.0       # … up to this (a server's Retry-After is honoured up to it too)
CONNECT_S = 10.0           # connecting must not take the whole answer's time
TAIL = 2000                # characters of a command agent's output kept with a failure
COMMAND_ENV = ("PATH", "LANG", "LC_ALL", "TERM")   # what a command agent sees besides pass_env


@dataclass
class Answer:
    """What one request to an agent came to."""

    text: str | None
    exchanges: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def tokens(self) -> int:
        """Tokens spent (in + out), estimated at four characters a token where the server did
        not say: budgets must count a server that reports no usage too."""
        total = 0
        for ex in self.exchanges:
            tokens_in, tokens_out = ex.get("tokens_in"), ex.get("tokens_out")
            total += tokens_in if tokens_in is not None else len(ex.get("prompt") or "") // 4
            total += tokens_out if tokens_out is not None else len(ex.get("response") or "") // 4
        return total


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(str(text).split())[:limit]


class ChatClient:
    """``POST {base_url}/chat/completions``, streamed where the server streams, with retries and
    backoff on 429 and 5xx, all inside the agent's ``timeout_s`` per answer."""

    def __init__(self, name: str, agent: AgentConfig) -> None:
        self.name = name
        self.agent = agent

    def headers(self) -> dict[str, str]:
        """The key is read from the named variable at request time and only ever goes into
        this request's header: never into a file, a record or a child's environment."""
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.agent.api_key_env) if self.agent.api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.agent.model, "messages": messages,
                                "max_tokens": self.agent.max_tokens}
        if self.agent.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    def ask(self, messages: list[dict[str, str]]) -> Answer:
        """One answer, retried on 429/5xx and on a refused connection until ``timeout_s``."""
        prompt = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
        deadline = time.monotonic() + self.agent.timeout_s
        answer = Answer(text=None)
        for attempt in range(self.agent.retries + 1):
            exchange, retry_after = self._attempt(messages, prompt, deadline)
            answer.exchanges.append(exchange)
            if exchange["status"] == "ok":
                answer.text = exchange["response"]
                return answer
            answer.error = exchange["error"]
            if retry_after is None or attempt == self.agent.retries:
                return answer
            wait = min(retry_after if retry_after > 0 else BACKOFF_S * 2 ** attempt, BACKOFF_MAX_S)
            if time.monotonic() + wait >= deadline:
                answer.error += f" (no time left to retry within timeout_s {self.agent.timeout_s:g})"
                return answer
            time.sleep(wait)
        return answer

    def _attempt(self, messages: list[dict[str, str]], prompt: str,
                 deadline: float) -> tuple[dict[str, Any], float | None]:
        """One HTTP request: its exchange row and, when it may be retried, the seconds the server
        asked to wait (0: none given)."""
        started = time.monotonic()
        exchange: dict[str, Any] = {"proposer": self.name, "model": self.agent.model,
                                    "prompt": prompt, "status": "failed"}
        left = max(deadline - started, 0.001)
        timeout = httpx.Timeout(left, connect=min(CONNECT_S, left))
        retry_after: float | None = None
        try:
            with httpx.Client(timeout=timeout) as client, client.stream(
                    "POST", f"{self.agent.base_url.rstrip('/')}/chat/completions",
                    headers=self.headers(), json=self.body(messages)) as response:
                if response.status_code != 200:
                    response.read()
                    exchange["response"] = response.text[:TAIL]
                    exchange["error"] = f"HTTP {response.status_code}: {_one_line(response.text, 200)}"
                    if response.status_code in RETRY_STATUS:
                        retry_after = _retry_after(response.headers.get("retry-after"))
                else:
                    self._read(response, exchange, deadline)
        except httpx.TimeoutException:
            exchange["error"] = f"timeout: no complete answer within timeout_s {self.agent.timeout_s:g}"
            exchange["finish_reason"] = "timeout"
        except httpx.ConnectError as exc:
            exchange["error"] = f"cannot connect to {self.agent.base_url}: {_one_line(exc)}"
            retry_after = 0.0
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            exchange["error"] = f"bad answer from {self.agent.base_url}: {type(exc).__name__}: {_one_line(exc)}"
        exchange["latency_s"] = round(time.monotonic() - started, 3)
        return exchange, retry_after

    def _read(self, response: httpx.Response, exchange: dict[str, Any], deadline: float) -> None:
        """Fill ``exchange`` from a 200 answer, server-sent events or one JSON object."""
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            parts: list[str] = []
            for line in response.iter_lines():
                if time.monotonic() > deadline:
                    exchange["response"] = "".join(parts)
                    raise httpx.ReadTimeout("stream still running at the deadline")
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                _merge_chunk(json.loads(line[5:]), parts, exchange)
            text = "".join(parts)
        else:
            data = json.loads(response.read())
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            exchange["finish_reason"] = choice.get("finish_reason")
            exchange["model"] = data.get("model") or exchange["model"]
            _usage(data.get("usage"), exchange)
        exchange["response"] = text
        exchange["status"] = "ok"
        exchange["error"] = None


def _merge_chunk(chunk: dict[str, Any], parts: list[str], exchange: dict[str, Any]) -> None:
    for choice in chunk.get("choices") or []:
        content = (choice.get("delta") or {}).get("content")
        if content:
            parts.append(content)
        if choice.get("finish_reason"):
            exchange["finish_reason"] = choice["finish_reason"]
    if chunk.get("model"):
        exchange["model"] = chunk["model"]
    _usage(chunk.get("usage"), exchange)


def _usage(usage: Any, exchange: dict[str, Any]) -> None:
    if isinstance(usage, dict):
        exchange["tokens_in"] = usage.get("prompt_tokens")
        exchange["tokens_out"] = usage.get("completion_tokens")


def _retry_after(value: str | None) -> float:
    try:
        return max(float(value), 0.0) if value else 0.0
    except ValueError:
        return 0.0          # an HTTP date: our own backoff instead


class CommandAgent:
    """A coding agent run non-interactively: it gets the prompt and the files it names in a
    fresh directory outside the home, an environment of ``COMMAND_ENV`` plus ``pass_env``
    only (no key unless configured), and must write ``candidate.py`` there within
    ``timeout_s``."""

    def __init__(self, name: str, agent: AgentConfig) -> None:
        self.name = name
        self.agent = agent

    def env(self, workdir: Path) -> dict[str, str]:
        keep = (*COMMAND_ENV, *self.agent.pass_env)
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env["HOME"] = str(workdir)
        env["TMPDIR"] = str(workdir)
        return env

    def ask(self, prompt: str, files: dict[str, str]) -> Answer:
        with tempfile.TemporaryDirectory(prefix="kernelab-agent-") as tmp:
            workdir = Path(tmp)
            (workdir / "prompt.md").write_text(prompt)
            for name, text in files.items():
                (workdir / name).write_text(text)
            argv = [a.replace("{prompt}", str(workdir / "prompt.md")).replace("{workdir}", str(workdir))
                    for a in self.agent.command]
            exchange: dict[str, Any] = {"proposer": self.name, "model": self.agent.command[0],
                                        "prompt": prompt, "status": "failed"}
            started = time.monotonic()
            output, code = self._run(argv, workdir)
            exchange["latency_s"] = round(time.monotonic() - started, 3)
            exchange["finish_reason"] = "timeout" if code is None else f"exit {code}"
            text = _command_answer(workdir)
            exchange["response"] = text if text is not None else output[-TAIL:]
            if code is None:
                exchange["error"] = f"timeout: {argv[0]} ran past timeout_s {self.agent.timeout_s:g}"
            elif text is None:
                exchange["error"] = (f"{argv[0]} exited {code} without writing candidate.py: "
                                     f"{_one_line(output[-300:])}")
            else:
                exchange["status"] = "ok"
        return Answer(text=text if exchange["status"] == "ok" else None, exchanges=[exchange],
                      error=exchange.get("error"))

    def _run(self, argv: list[str], workdir: Path) -> tuple[str, int | None]:
        """Its output and exit code (None: killed at the deadline, with its process group)."""
        try:
            proc = subprocess.Popen(argv, cwd=workdir, env=self.env(workdir), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        except OSError as exc:
            return f"cannot run {argv[0]}: {exc}", 127
        try:
            out, _ = proc.communicate(timeout=self.agent.timeout_s)
            return out.decode(errors="replace"), proc.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return out.decode(errors="replace"), None


def _command_answer(workdir: Path) -> str | None:
    """``candidate.py`` (and ``edit.txt``) in the answer format the parser reads, or None."""
    candidate, edit = workdir / "candidate.py", workdir / "edit.txt"
    if not candidate.is_file():
        return None
    lines = edit.read_text(errors="replace").strip().splitlines() if edit.is_file() else []
    head = f"EDIT: {lines[0]}\n" if lines else ""
    return f"{head}```python\n{candidate.read_text(errors='replace').rstrip()}\n```"
