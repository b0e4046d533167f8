"""One job in depth: its full name, peers and memory plan; candidates with their lineage and
edits, and for the selected candidate its source, its diff against its parent, its timing
distribution, clock state, gate verdict (with the wall time of each stage), the transcript of
the exchanges that produced an agent's candidate and its machine code; and every configuration
the job screened."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.syntax import Syntax
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Static, TabbedContent, TabPane

from store import fingerprints, status
from tui.data import (
    Block,
    Candidate,
    Job,
    JobFacts,
    JobSeries,
    Screened,
    format_evidence,
    load_blocks,
    load_job_facts,
    load_series,
    load_source,
    load_transcript,
    parent_diff,
)
from tui.messages import DataChanged
from tui.screens.controls import CONTROL_BINDINGS, JobControls
from tui.widgets.queue import VIM_BINDINGS
from tui.widgets.status import StatusBar
from tui.widgets.table import Table
from tui.widgets.timing import TimingHistogram

TABS = ("source", "diff", "timing", "clock", "gate", "transcript", "machine", "screened")
SCREENED_COLUMNS = ("#", "status", "screened ms", "regs", "spills", "→ cand", "params", "detail")
SCREENED_NOTE = ("Configurations screened by a quick timing, fastest first: a screened time only picks "
                 "what goes on to the gate and the A/B against the incumbent; it is never a result.")
SCREENED_STYLE = {"timed": "green", "spills": "yellow", "too_big": "yellow", "failed": "red", "wrong": "bold red"}
NO_FINGERPRINT = ("(no fingerprint: candidates get one when evaluated on a GPU; "
                  "`kernelab fingerprint FILE --arch sm_90` makes one without)")


@dataclass(frozen=True)
class CandidateView:
    """What the right-hand tabs show for one candidate."""

    candidate: Candidate
    source: str
    diff: str
    blocks: tuple[Block, ...]
    lineage: tuple[Candidate, ...]
    transcript: tuple[dict[str, Any], ...] = ()
    machine: str = NO_FINGERPRINT
    stages: tuple[tuple[str, float], ...] = ()


Loaded = tuple[JobSeries | None, CandidateView | None, JobFacts]
"""What one reload of the detail reads: the job's series, the selected candidate, the job's facts."""


def load_candidate_view(conn: sqlite3.Connection, series: JobSeries,
                        candidate_id: int) -> CandidateView | None:
    by_id = {c.id: c for c in series.candidates}
    cand = by_id.get(candidate_id)
    if cand is None:
        return None
    source = load_source(conn, cand.id) or ""
    parent_source = load_source(conn, cand.parent_id) if cand.parent_id else None
    lineage: list[Candidate] = [cand]
    while lineage[-1].parent_id in by_id and len(lineage) < len(by_id):
        lineage.append(by_id[lineage[-1].parent_id])  # type: ignore[index]
    return CandidateView(candidate=cand, source=source,
                         diff=parent_diff(parent_source, source, cand.parent_id, cand.id),
                         blocks=load_blocks(conn, cand.id), lineage=tuple(lineage),
                         transcript=load_transcript(conn, series.job.id, cand.id),
                         machine=machine_text(conn, cand), stages=load_stages(conn, cand.id))


def load_stages(conn: sqlite3.Connection, candidate_id: int) -> tuple[tuple[str, float], ...]:
    """The wall seconds of each stage of the candidate's evaluation, as recorded in its result."""
    row = conn.execute("SELECT result FROM candidates WHERE id = ?", (candidate_id,)).fetchone()
    result = status.loads(row[0]) if row else None
    stages = result.get("stages") if isinstance(result, dict) else None
    if not isinstance(stages, dict):
        return ()
    return tuple((k, float(v)) for k, v in stages.items() if isinstance(v, int | float))


def machine_text(conn: sqlite3.Connection, cand: Candidate) -> str:
    """The candidate's kernels beside its parent's (differences marked), or alone."""
    try:
        mine = fingerprints.load(conn, cand.id)
        parent = fingerprints.load(conn, cand.parent_id) if cand.parent_id else None
    except sqlite3.OperationalError:   # a database from before fingerprints were kept
        return NO_FINGERPRINT
    if mine is None:
        return NO_FINGERPRINT
    if parent is None:
        return fingerprints.render(mine)
    return fingerprints.render_pair(parent, mine, f"#{cand.parent_id} (parent)", f"#{cand.id}")


def verdict_text(cand: Candidate) -> Text:
    """Verdict spelt out (pass/fail/error, ✓ when accepted) and coloured as a second cue."""
    if cand.verdict is None:
        return Text(cand.state, style="dim")
    style = {"pass": "green", "fail": "bold red", "error": "red"}.get(cand.verdict, "")
    return Text(cand.verdict + (" ✓" if cand.accepted else ""), style=style)


def candidate_cells(cand: Candidate) -> tuple[str | Text, ...]:
    ms = f"{cand.candidate_ms:.4g}" if cand.candidate_ms is not None else "–"
    speedup = f"{cand.speedup:.2f}" if cand.speedup else "–"
    return (str(cand.id), str(cand.parent_id or "–"), verdict_text(cand), ms, speedup,
            cand.edit or "")


def gate_text(cand: Candidate, stages: tuple[tuple[str, float], ...] = ()) -> str:
    lines = [f"verdict: {cand.verdict or cand.state}" + ("  (accepted)" if cand.accepted else "")]
    if cand.rule:
        lines.append(f"rule: {cand.rule}")
    if cand.reason:
        lines.append(f"reason: {cand.reason}")
    if cand.evidence:
        lines.append(f"evidence: {format_evidence(cand.evidence)}")
    if cand.max_rel_error is not None:
        lines.append(f"max rel error: {cand.max_rel_error:.3g} (tolerance {cand.tolerance})")
    if cand.speedup is not None:
        lines.append(f"speedup: {cand.speedup:.3f}  CI [{cand.speedup_lo or 0:.3f}, "
                     f"{cand.speedup_hi or 0:.3f}]")
    if cand.faster_than_noise is not None:
        lines.append("faster than noise" if cand.faster_than_noise
                     else "not faster than noise")
    if stages:
        lines.append("wall time: " + " · ".join(f"{name.replace('_', ' ')} {sec:.3g} s" for name, sec in stages))
    return "\n".join(lines)


def screened_cells(row: Screened) -> tuple[str | Text, ...]:
    return (str(row.id), Text(row.status, style=SCREENED_STYLE.get(row.status, "")),
            f"{row.ms:.4g}" if row.ms is not None else "–",
            str(row.registers) if row.registers is not None else "–",
            str(row.spills) if row.spills is not None else "–",
            f"#{row.candidate_id}" if row.candidate_id else "–", row.params, row.detail or "")


def transcript_text(cand: Candidate, transcript: tuple[dict[str, Any], ...]) -> Text:
    """Each exchange: who answered, how (status, tokens, latency, finish reason), then the
    prompt and the response as sent and received."""
    if not transcript:
        return Text(f"no agent transcript: proposed by {cand.proposer}", style="dim")
    text = Text()
    for i, ex in enumerate(transcript, 1):
        tokens = f"{ex['tokens_in'] if ex['tokens_in'] is not None else '?'} in / " \
                 f"{ex['tokens_out'] if ex['tokens_out'] is not None else '?'} out"
        latency = f"{ex['latency_s']:.2f} s" if ex["latency_s"] is not None else "–"
        style = "green" if ex["status"] == "ok" else "bold red"
        text.append(f"exchange {i} · {ex['proposer']} · {ex['model'] or '?'} · ", style="bold")
        text.append(ex["status"], style=style)
        text.append(f" · {tokens} · {latency} · finish {ex['finish_reason'] or '–'}\n")
        if ex["error"]:
            text.append(f"{ex['error']}\n", style="red")
        text.append("prompt\n", style="bold underline")
        text.append(f"{ex['prompt']}\n")
        text.append("response\n", style="bold underline")
        text.append(f"{ex['response'] or '(none)'}\n\n")
    return text


def summary_text(job: Job, facts: JobFacts) -> Text:
    """The job in a few lines: its full name and state, the reference and the best with both
    speedups, the speed-of-light floor, the peers and the memory plan where recorded."""
    ref = "–"
    if job.reference_ms is not None:
        ref = f"{job.reference_ms:.4g} ms ±{(job.reference_noise or 0):.1%}"
    best = "–"
    if job.best_ms:
        ratios = [f"×{v:.2f} {label}" for v, label in ((job.speedup, "reference"),
                                                        (job.speedup_vs_best_peer, "best peer")) if v]
        best = f"{job.best_ms:.4g} ms" + (f" ({', '.join(ratios)})" if ratios else "")
    sol = f"{job.sol_ms:.4g} ms" if job.sol_ms is not None else "–"
    if job.sol_ms and job.best_ms:
        sol += f" (best at {job.sol_ms / job.best_ms:.0%})"
    device = job.device or "no device"
    if job.node and job.device and not job.device.startswith(f"{job.node}/"):
        device += f" @ {job.node}"
    text = Text.assemble((f"#{job.id} {job.problem}", "bold"), f"  {job.kind} · ", (job.state, "bold"),
                         f" · {device} · pri {job.priority}\nreference {ref} · best {best} · "
                         f"speed of light {sol}")
    if facts.peers:
        text.append(f"\npeers: {facts.peers}")
    for line in facts.plan:
        text.append(f"\n{line}")
    if job.stop_reason or job.error:
        text.append(f"\n{job.stop_reason or job.error}", style="italic")
    return text


class CandidateTable(Table[str | Text]):
    """The job's candidates in order; updated in place while the job runs."""

    BINDINGS = VIM_BINDINGS

    def __init__(self, **kwargs: str) -> None:
        super().__init__(cursor_type="row", **kwargs)
        self._rows: tuple[Candidate, ...] = ()

    def on_mount(self) -> None:
        for label in ("#", "parent", "verdict", "ms", "×A", "edit"):
            self.add_column(label, key=label)

    @property
    def selected_id(self) -> int | None:
        if 0 <= self.cursor_row < len(self._rows):
            return self._rows[self.cursor_row].id
        return None

    def show(self, candidates: tuple[Candidate, ...]) -> None:
        if candidates == self._rows:
            return
        old = {c.id: c for c in self._rows}
        for cand in candidates:
            if cand.id not in old:
                self.add_row(*candidate_cells(cand), key=str(cand.id))
            elif old[cand.id] != cand:
                for key, cell in zip(("#", "parent", "verdict", "ms", "×A", "edit"),
                                     candidate_cells(cand), strict=True):
                    self.update_cell(str(cand.id), key, cell)
        self._rows = candidates


class JobDetail(JobControls):
    """Opened with enter on a queue row; escape or h goes back."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,h", "back", "Back"),
        *(Binding(str(i + 1), f"tab('{tab}')", tab.title(), show=False)
          for i, tab in enumerate(TABS)),
        *CONTROL_BINDINGS,
    ]

    def __init__(self, job_id: int) -> None:
        super().__init__()
        self.job_id = job_id
        self.series: JobSeries | None = None
        self.view: CandidateView | None = None
        self.facts: JobFacts | None = None

    def compose(self) -> ComposeResult:
        yield StatusBar(id="status")
        yield Static("", id="summary")
        with Horizontal(id="detail"):
            yield CandidateTable(id="candidates")
            with Vertical(id="candidate"):
                yield Static("", id="lineage")
                with TabbedContent(id="tabs"):
                    with TabPane("1 source", id="source"), VerticalScroll():
                        yield Static("", id="source-text")
                    with TabPane("2 diff", id="diff"), VerticalScroll():
                        yield Static("", id="diff-text")
                    with TabPane("3 timing", id="timing"):
                        yield TimingHistogram(id="histogram")
                    with TabPane("4 clock", id="clock"):
                        yield Table(id="blocks", cursor_type="row")
                    with TabPane("5 gate", id="gate"), VerticalScroll():
                        yield Static("", id="gate-text")
                    with TabPane("6 transcript", id="transcript"), VerticalScroll():
                        yield Static("", id="transcript-text")
                    with TabPane("7 machine", id="machine"), VerticalScroll():
                        yield Static("", id="machine-text")
                    with TabPane("8 screened", id="screened"), Vertical():
                        yield Static(SCREENED_NOTE, id="screened-note")
                        yield Table(id="screened-table", cursor_type="row")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#candidates").border_title = "candidates"
        self.query_one("#blocks", DataTable).add_columns(
            "side", "block", "median ms", "SM MHz", "clock reasons", "°C", "W", "throttled")
        self.query_one("#screened-table", DataTable).add_columns(*SCREENED_COLUMNS)
        self.query_one(CandidateTable).focus()
        self.reload()

    @on(DataChanged)
    def reload(self) -> None:
        selected = self.query_one(CandidateTable).selected_id
        job_id = self.job_id

        def query(conn: sqlite3.Connection) -> Loaded:
            series = load_series(conn, job_id)
            if series is None:
                return None, None, JobFacts()
            facts = load_job_facts(conn, job_id)
            if not series.candidates:
                return series, None, facts
            wanted = selected if selected is not None else series.candidates[-1].id
            return series, load_candidate_view(conn, series, wanted), facts

        self.kapp.load(self, query, self._apply)

    def _apply(self, result: Loaded | None) -> None:
        self.query_one(StatusBar).show(self.kapp.status_line(None))
        if result is None:
            return
        series, view, facts = result
        self.series = series
        if series is None:
            self.query_one("#summary", Static).update(f"job {self.job_id} no longer exists")
            return
        self.query_one("#summary", Static).update(summary_text(series.job, facts))
        self._show_screened(facts)
        table = self.query_one(CandidateTable)
        first_fill = not table.row_count
        table.show(series.candidates)
        if first_fill and series.candidates:
            table.move_cursor(row=len(series.candidates) - 1)
        if view is not None and view.candidate.id == table.selected_id:
            self._show_view(view)

    def _show_screened(self, facts: JobFacts) -> None:
        if self.facts is not None and facts.screened == self.facts.screened:
            self.facts = facts
            return
        self.facts = facts
        table = self.query_one("#screened-table", DataTable)
        table.clear()
        for row in facts.screened:
            table.add_row(*screened_cells(row), key=str(row.id))
        self.query_one("#screened-note", Static).update(
            SCREENED_NOTE if facts.screened else "No configuration screened in this job.")

    def _show_view(self, view: CandidateView) -> None:
        if view == self.view:
            return
        self.view = view
        cand = view.candidate
        chain = " ← ".join(f"#{c.id}" for c in view.lineage)
        self.query_one("#lineage", Static).update(
            Text.assemble((chain, "bold"), f"  {cand.proposer} · {cand.language}\n",
                          (cand.edit or "", "italic")))
        self.query_one("#source-text", Static).update(
            Syntax(view.source, "python", theme="ansi_dark", line_numbers=True))
        self.query_one("#diff-text", Static).update(
            Syntax(view.diff or "(identical to its parent)", "diff", theme="ansi_dark"))
        self.query_one(TimingHistogram).show(view.blocks)
        blocks = self.query_one("#blocks", DataTable)
        blocks.clear()
        for b in view.blocks:
            blocks.add_row(b.side, str(b.idx), f"{b.median_ms:.4g}",
                           f"{b.sm_clock_mhz:.0f}" if b.sm_clock_mhz else "–",
                           b.clock_reasons or "–",
                           f"{b.temperature_c:.0f}" if b.temperature_c is not None else "–",
                           f"{b.power_w:.0f}" if b.power_w is not None else "–",
                           "yes" if b.throttled else "no")
        self.query_one("#gate-text", Static).update(gate_text(cand, view.stages))
        self.query_one("#transcript-text", Static).update(transcript_text(cand, view.transcript))
        self.query_one("#machine-text", Static).update(Text(view.machine))

    @on(DataTable.RowHighlighted, "#candidates")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        selected = self.query_one(CandidateTable).selected_id
        series = self.series
        if series is None or selected is None or (self.view and self.view.candidate.id == selected):
            return
        self.kapp.load(self, lambda c: load_candidate_view(c, series, selected),
                       self._apply_view)

    def _apply_view(self, view: CandidateView | None) -> None:
        if view is not None and view.candidate.id == self.query_one(CandidateTable).selected_id:
            self._show_view(view)

    def current_job(self) -> Job | None:
        return self.series.job if self.series else None

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
