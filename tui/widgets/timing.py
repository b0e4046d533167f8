"""A candidate's timing distribution: histograms of the baseline (A) and candidate (B)
samples from its interleaved blocks, drawn by plotext through ``textual-plotext``."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from tui.data import Block, timing_summary


class TimingHistogram(PlotextPlot):
    """Redrawn only when the blocks change."""

    def __init__(self, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self._blocks: tuple[Block, ...] | None = None

    def show(self, blocks: tuple[Block, ...]) -> None:
        if blocks == self._blocks:
            return
        self._blocks = blocks
        plt = self.plt
        plt.clear_figure()
        plt.xlabel("ms")
        summary = timing_summary(blocks)
        if not summary:
            plt.title("not timed (gate failure, error, or still running)")
        else:
            plt.title("  ".join(f"{side}: n={n} median {med:.4g} ms ±{sd:.2g}"
                                for side, (n, med, sd) in summary.items()))
        labels = {"A": ("baseline (A)", "orange", "▒"), "B": ("candidate (B)", "cyan", "█")}
        for side in summary:
            values = [v for b in blocks if b.side == side for v in b.samples]
            label, color, marker = labels.get(side, (side, "white", "█"))
            plt.hist(values, bins=20, label=label, color=color, marker=marker)
        self.refresh()
