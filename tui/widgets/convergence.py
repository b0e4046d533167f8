"""The live convergence chart of one job, drawn by plotext through ``textual-plotext``.

Every candidate is a point at its ordinal: timed ones at their time, gate failures (never
timed) as ``x`` on the chart's floor. The incumbent is a step line; the reference time is a
line with its noise band either side; the speed-of-light floor a line at the bottom. Marker
shapes differ, not only colours, so the chart reads the same under NO_COLOR.
"""

from __future__ import annotations

from textual.app import RenderResult
from textual_plotext import PlotextPlot

from tui.data import JobSeries, incumbent_steps


class ConvergenceChart(PlotextPlot):
    """Redrawn only when the job's series changes (plotext rebuilds the whole figure)."""

    def __init__(self, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self.border_title = "convergence"
        self._series: JobSeries | None = None
        self._empty_title = "select a job"

    def show(self, series: JobSeries | None) -> None:
        if series == self._series and self._series is not None:
            return
        self._series = series
        self.refresh()

    def render(self) -> RenderResult:
        """Build the figure at render time: its y range depends on the height in rows."""
        self._draw()
        return super().render()

    def _rows(self) -> int:
        """Text rows of the plotting area (the widget less its axes and labels)."""
        return max(3, self.size.height - 4)

    def _y_range(self, series: JobSeries) -> tuple[float, float, float]:
        """(row for gate failures, top, bottom) so that failures sit one text row below
        every timed value and line, whatever the terminal's height."""
        job = series.job
        levels = [c.candidate_ms for c in series.candidates if c.candidate_ms is not None]
        levels += [v for v in (job.reference_ms, job.sol_ms) if v is not None]
        if job.reference_ms is not None and job.reference_noise:
            levels.append(job.reference_ms * (1 + job.reference_noise))
        low, high = (min(levels), max(levels)) if levels else (0.0, 1.0)
        row = (high - low) / self._rows() or max(high * 0.05, 1e-6)
        return low - 1.5 * row, high + row, low - 2.5 * row

    def _draw(self) -> None:
        plt = self.plt
        plt.clear_figure()
        plt.xlabel("candidate")
        plt.ylabel("ms")
        series = self._series
        if series is None:
            plt.title(self._empty_title)
            return
        job = series.job
        self.border_title = f"convergence · {job.problem} #{job.id}"
        timed = [c for c in series.candidates if c.candidate_ms is not None]
        failed = [c for c in series.candidates if c.failed_gate]
        if not series.candidates:
            plt.title("no candidates yet")
        last = max(1, len(series.candidates))
        fail_y, top, bottom = self._y_range(series)
        plt.ylim(bottom, top)
        plt.xlim(0.5, last + 0.5)
        plt.xticks(_integer_ticks(last))
        ticks = _spaced(_level_ticks(series), (top - bottom) / self._rows(), fail_y)
        plt.yticks([fail_y, *ticks], ["fail", *(f"{t:.3g}" for t in ticks)])
        span = [0.5, last + 0.5]
        if job.reference_ms is not None and job.reference_noise:
            for sign in (1, -1):
                level = job.reference_ms * (1 + sign * job.reference_noise)
                plt.plot(span, [level] * 2, color="orange", marker="·",
                         label=f"noise ±{job.reference_noise:.1%}" if sign > 0 else None)
        if job.reference_ms is not None:
            plt.plot(span, [job.reference_ms] * 2, color="orange", label="reference",
                     marker="-")
        if job.sol_ms is not None:
            plt.plot(span, [job.sol_ms] * 2, color="magenta", marker="=",
                     label="speed of light")
        steps_x, steps_y = incumbent_steps(series)
        if steps_x:
            plt.plot(steps_x, steps_y, color="green", marker="braille", label="incumbent")
        if timed:
            plt.scatter([c.ordinal for c in timed], [c.candidate_ms for c in timed],
                        color="cyan", marker="•", label="candidate")
        if failed:
            plt.scatter([c.ordinal for c in failed], [fail_y] * len(failed),
                        color="red", marker="x", label="gate fail")


def _integer_ticks(last: int, most: int = 8) -> list[int]:
    """Candidate ordinals as x ticks: whole numbers only, at most ``most`` of them."""
    step = max(1, -(-last // most))
    return list(range(1, last + 1, step))


def _level_ticks(series: JobSeries) -> list[float]:
    """Y ticks at the levels that matter, most important first (incumbent, reference, speed
    of light, slowest candidate) rather than at round numbers, so a six-row chart reads."""
    job = series.job
    steps = incumbent_steps(series)[1]
    timed = [c.candidate_ms for c in series.candidates if c.candidate_ms is not None]
    levels = (steps[-1] if steps else None, job.reference_ms, job.sol_ms,
              max(timed) if timed else None)
    return [v for v in levels if v is not None]


def _spaced(ticks: list[float], row: float, reserved: float) -> list[float]:
    """Keep, in order of importance, only ticks at least a text row apart: plotext would
    otherwise pick one of two colliding labels itself, not always the same one."""
    kept = [reserved]
    for tick in ticks:
        if all(abs(tick - other) >= row for other in kept):
            kept.append(tick)
    return sorted(kept[1:])
