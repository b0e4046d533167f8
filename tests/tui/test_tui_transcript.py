"""The job detail's transcript tab: an agent's candidate shows the exchanges that produced it
(a retried 429 included); another proposer's candidate says it has none."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from store.exchanges import add_exchange
from tests.tui.driving import make_app, settle
from tui.screens.detail import JobDetail


def _exchanges(writer: sqlite3.Connection) -> None:
    base = {"proposer": "agents.local", "model": "qwen2.5-coder-32b",
            "prompt": "[user]\nPort the reference `softmax`.", "latency_s": 0.5}
    add_exchange(writer, 1, 12, {**base, "status": "failed", "error": "HTTP 429: slow down",
                                 "response": '{"error": "rate"}'})
    add_exchange(writer, 1, 12, {**base, "status": "ok", "tokens_in": 812, "tokens_out": 344,
                                 "finish_reason": "stop",
                                 "response": "EDIT: persistent rows\n```python\nclass ModelNew: ...\n```"})


async def test_transcript_tab_shows_the_agent_exchanges_of_the_selected_candidate(
        db_path: Path, writer: sqlite3.Connection) -> None:
    _exchanges(writer)
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        await pilot.press("j", "enter")
        await settle(pilot)
        detail = app.screen
        assert isinstance(detail, JobDetail) and detail.view is not None
        assert detail.view.candidate.id == 12
        await pilot.press("6")
        text = str(detail.query_one("#transcript-text").render())
        assert "exchange 1 · agents.local · qwen2.5-coder-32b · failed" in text
        assert "HTTP 429: slow down" in text
        assert "exchange 2" in text and "812 in / 344 out" in text and "finish stop" in text
        assert "Port the reference `softmax`." in text and "EDIT: persistent rows" in text
        await pilot.press("k")                              # candidate 11: not an agent's
        await settle(pilot)
        assert detail.view.candidate.id == 11
        assert "no agent transcript" in str(detail.query_one("#transcript-text").render())
