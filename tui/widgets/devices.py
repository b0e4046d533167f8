"""The devices panel: one two-line row per device, each metric with its recent history.

The values come from the daemon's ``gpu_samples`` (the TUI never initialises NVML), so any
number of viewers cost the GPUs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from tui.data import Device, DeviceSample


@dataclass(frozen=True)
class Metric:
    """How one sample field is labelled and formatted."""

    field: str
    label: str
    fmt: Callable[[DeviceSample], str]


def _value(value: float | None, fmt: str) -> str:
    return "–" if value is None else fmt.format(value)


def _memory(sample: DeviceSample) -> str:
    if sample.mem_used_mb is None:
        return "–"
    total = f"/{sample.mem_total_mb / 1024:.0f}" if sample.mem_total_mb else ""
    return f"{sample.mem_used_mb / 1024:.0f}{total}G"


METRICS = (
    Metric("util_pct", "util", lambda s: _value(s.util_pct, "{:.0f}%")),
    Metric("sm_clock_mhz", "sm", lambda s: _value(s.sm_clock_mhz, "{:.0f}MHz")),
    Metric("temperature_c", "temp", lambda s: _value(s.temperature_c, "{:.0f}°C")),
    Metric("power_w", "power", lambda s: _value(s.power_w, "{:.0f}W")),
    Metric("mem_used_mb", "mem", _memory),
)


class MetricCell(Vertical):
    """A metric's current value above a sparkline of its history."""

    def __init__(self, metric: Metric) -> None:
        super().__init__(classes="metric")
        self.metric = metric

    def compose(self) -> ComposeResult:
        yield Static(self.metric.label, classes="metric-value")
        yield Sparkline([], classes="metric-spark")

    def show(self, device: Device) -> None:
        sample = device.latest
        text = f"{self.metric.label} {self.metric.fmt(sample) if sample else '–'}"
        self.query_one(".metric-value", Static).update(text)
        self.query_one(Sparkline).data = device.history(self.metric.field)


class DeviceRow(Horizontal):
    """One device: its id and model, then each metric."""

    def __init__(self, device: Device) -> None:
        super().__init__(classes="device-row")
        self.device = device

    def compose(self) -> ComposeResult:
        name = self.device.name.removeprefix("NVIDIA ")
        yield Static(f"[b]{self.device.label}[/b]\n{name}", classes="device-name", markup=True)
        for metric in METRICS:
            yield MetricCell(metric)

    def on_mount(self) -> None:
        self.show(self.device)

    def show(self, device: Device) -> None:
        self.device = device
        for cell in self.query(MetricCell):
            cell.show(device)


class DevicesPanel(Vertical):
    """All devices; rows are rebuilt only when the set of devices changes."""

    def __init__(self, **kwargs: str) -> None:
        super().__init__(**kwargs)
        self.border_title = "devices"
        self._shown: tuple[Device, ...] | None = None

    def compose(self) -> ComposeResult:
        yield Static("no devices reported yet", classes="empty")

    async def show(self, devices: tuple[Device, ...]) -> None:
        if devices == self._shown:
            return
        same_ids = self._shown is not None and [d.id for d in devices] == [
            d.id for d in self._shown]
        self._shown = devices
        if same_ids and devices:
            for row, device in zip(self.query(DeviceRow), devices, strict=True):
                row.show(device)
            return
        await self.remove_children()
        if devices:
            await self.mount_all(DeviceRow(d) for d in devices)
        else:
            await self.mount(Static("no devices reported yet", classes="empty"))
        self.styles.height = 2 * max(1, len(devices)) + 2
