"""The ``agents.NAME`` proposers: a model behind any OpenAI-compatible endpoint, or a
command-line coding agent, asked for one single-edit candidate at a time.

The harness, not the agent, decides what is correct and what is faster: whatever comes back is
untrusted code that is gated and timed like any other candidate. What the agent answered, and
how, is kept: each ``Proposal`` carries its exchanges, and the exchanges of failed proposals
(no usable code, not one edit, a timeout, an HTTP error) wait in ``take_failed`` for the loop
to record, so no answer is lost and none crashes a job.

Overlap: once a usable proposal is handed over, the request for the next one starts on a
background thread with the history as it stands, so a slow model writes candidate N+1 while
the device gates and times candidate N. The thread never touches the store; everything is
recorded by the loop, on its own thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from kernelabd.config import AgentConfig
from kernelabd.propose.agent_client import Answer, ChatClient, CommandAgent
from kernelabd.propose.agent_prompt import (
    parse_answer,
    system_message,
    user_message,
)
from kernelabd.propose.base import (
    AGENT_PREFIX,
    Candidate,
    Decline,
    JobContext,
    Proposal,
    ProposerUnavailable,
)
from kernelabd.propose.tune import params_of

FAILED_IN_A_ROW = 3      # failed proposals in a row before the agent gives its turn away

COMMAND_NOTE = """

You are running in a work directory holding `prompt.md` (this text), `reference.py` and, when
there is one, `incumbent.py`. Write the whole new file to `candidate.py` in this directory and
the one-line description of your single change to `edit.txt`."""


@dataclass
class Request:
    """One request for a candidate: what it was based on and what came back."""

    parent: Candidate | None
    language: str
    answer: Answer


class _Ahead:
    """A request running on a daemon thread (a job that ends meanwhile does not wait for it)."""

    def __init__(self, ask: Any, prompt: str) -> None:
        self.prompt = prompt
        self._done = threading.Event()
        self._value: Request | None = None
        self._ask = ask
        threading.Thread(target=self._run, name="agent-ahead", daemon=True).start()

    def _run(self) -> None:
        try:
            self._value = self._ask()
        finally:
            self._done.set()

    def result(self, wait: bool = True) -> Request | None:
        """The request once answered (``wait=False``: None while it still runs)."""
        if wait:
            self._done.wait()
        return self._value


class AgentProposer:
    """A proposer backed by one ``[agents.NAME]`` table."""

    def __init__(self, name: str, agent: AgentConfig) -> None:
        self.name = name
        self.agent = agent
        self.client = ChatClient(name, agent) if agent.kind == "openai" else CommandAgent(name, agent)
        self.asked = 0
        self.tokens = 0
        self.waited_s = 0.0
        self._failed: list[dict[str, Any]] = []
        self._ahead: _Ahead | None = None

    @classmethod
    def configured(cls, name: str, config: Any) -> AgentProposer:
        """The proposer ``agents.NAME`` of ``config``; ``ProposerUnavailable`` names what is
        missing."""
        short = name[len(AGENT_PREFIX):]
        agents = getattr(config, "agents", None) or {}
        if short not in agents:
            known = ", ".join(f"{AGENT_PREFIX}{n}" for n in agents) or "none configured"
            raise ProposerUnavailable(f"proposer {name!r}: kernelab.toml has no [agents.{short}] "
                                      f"table (agents: {known})")
        return cls(name, agents[short])

    # -- the proposer protocol -------------------------------------------------------------------

    def propose(self, ctx: JobContext) -> Proposal | Decline:
        """The next usable single-edit candidate, asking again after a failed answer up to
        ``FAILED_IN_A_ROW`` times; a ``Decline`` saying why once the budget is spent or the
        agent keeps failing."""
        failed = 0
        while failed < FAILED_IN_A_ROW:
            ahead, self._ahead = self._ahead, None
            request = ahead.result() if ahead is not None else None
            if request is None:
                over = self.over_budget(ctx)
                if over:
                    return Decline(over)
                request = self.request(ctx)
            proposal = self.accept(request)
            if proposal is not None:
                self.start_next(ctx, proposal)
                return proposal
            failed += 1
        return Decline(f"{failed} failed proposals in a row (last: {self._failed[-1].get('error')})")

    def close(self) -> list[dict[str, Any]]:
        """The job is over: what is left to record, including an answer asked ahead and never
        used (status ``unused``), or the request still running (abandoned, not waited for)."""
        left = self.take_failed()
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return left
        request = ahead.result(wait=False)
        if request is None:
            return [*left, {"proposer": self.name, "model": self.agent.model or self.agent.command[0],
                            "prompt": ahead.prompt, "status": "unused",
                            "error": "abandoned: the job ended while the agent was answering"}]
        return [*left, *({**ex, "status": "unused" if ex["status"] == "ok" else ex["status"],
                          "error": ex.get("error") or "unused: the job ended before this answer "
                                                      "was needed"}
                         for ex in request.answer.exchanges)]

    def take_failed(self) -> list[dict[str, Any]]:
        """Exchanges of failed proposals since the last call, for the loop to record."""
        failed, self._failed = self._failed, []
        return failed

    # -- steps -----------------------------------------------------------------------------------

    def over_budget(self, ctx: JobContext) -> str | None:
        """Which of this agent's per-job budgets is spent, if any. Proposals count those of this
        run and, after a restart, at least the candidates the history holds from it."""
        asked = max(self.asked, sum(1 for c in ctx.history if c.proposer == self.name))
        if asked >= self.agent.max_proposals:
            return f"budget: max_proposals ({self.agent.max_proposals}) asked"
        if self.agent.max_total_tokens and self.tokens >= self.agent.max_total_tokens:
            return f"budget: max_total_tokens ({self.agent.max_total_tokens}) spent ({self.tokens})"
        if self.agent.max_minutes and self.waited_s >= self.agent.max_minutes * 60:
            return f"budget: max_minutes ({self.agent.max_minutes:g}) spent waiting on the agent"
        return None

    def request(self, ctx: JobContext, in_flight: Candidate | None = None) -> Request:
        """Ask the agent once (any thread: it touches nothing but the agent)."""
        self.asked += 1
        system, user = self.messages(ctx, in_flight)
        if isinstance(self.client, ChatClient):
            answer = self.client.ask([{"role": "system", "content": system},
                                      {"role": "user", "content": user}])
        else:
            answer = self.client.ask(system + "\n\n" + user + COMMAND_NOTE, _files(ctx))
        self.tokens += answer.tokens
        self.waited_s += sum(ex.get("latency_s") or 0.0 for ex in answer.exchanges)
        return Request(parent=ctx.incumbent, language=ctx.sidecar.target, answer=answer)

    @staticmethod
    def messages(ctx: JobContext, in_flight: Candidate | None = None) -> tuple[str, str]:
        """The system and user messages for ``ctx``."""
        return system_message(ctx), user_message(ctx, in_flight)

    def accept(self, request: Request) -> Proposal | None:
        """The request's proposal, or ``None`` with its exchanges kept as a failed proposal."""
        answer = request.answer
        exchanges = [dict(ex) for ex in answer.exchanges]
        if answer.text is None:
            self._failed.extend(exchanges)
            return None
        parsed = parse_answer(answer.text, request.parent)
        if parsed.source is None:
            exchanges[-1].update(status="failed", error=parsed.error)
            self._failed.extend(exchanges)
            return None
        parent_id = request.parent.id if request.parent is not None else None
        return Proposal(source=parsed.source, edit=parsed.edit, parent_id=parent_id,
                        params=params_of(parsed.source), language=request.language,
                        exchanges=tuple(exchanges))

    def start_next(self, ctx: JobContext, proposal: Proposal) -> None:
        """Ask for the candidate after ``proposal`` while it is gated and timed, unless that
        one is the job's or this agent's last."""
        if ctx.budget.candidates_left <= 1 or self.over_budget(ctx):
            return
        in_flight = Candidate(id=0, proposer=self.name, source=proposal.source,
                              parent_id=proposal.parent_id, edit=proposal.edit, state="evaluating")
        prompt = "\n\n".join(self.messages(ctx, in_flight))
        self._ahead = _Ahead(lambda: self.request(ctx, in_flight), prompt)


def unconfigured(names: tuple[str, ...] | list[str], config: Any) -> str | None:
    """Why an ``agents.NAME`` among ``names`` cannot run (no such table), said before a job is
    queued for it; None when every one is configured."""
    for name in names:
        if name.startswith(AGENT_PREFIX):
            try:
                AgentProposer.configured(name, config)
            except ProposerUnavailable as exc:
                return str(exc)
    return None


def _files(ctx: JobContext) -> dict[str, str]:
    """What a command agent finds in its work directory besides the prompt."""
    files = {"reference.py": ctx.reference_source}
    incumbent = ctx.incumbent
    if incumbent is not None:
        files["incumbent.py"] = incumbent.source
    elif ctx.start_source:
        files["incumbent.py"] = ctx.start_source
    return files

