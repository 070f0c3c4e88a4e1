"""``prism replay --plots``: PNG figures for people (matplotlib, no screen needed).

- ``steps.png``: step duration over wall-clock time, one panel per job,
  the job's anomalies marked and switch/link anomalies shaded, y from 0;
- ``switches.png``: effective bandwidth of every switch per window, as a
  heat map relative to its tier's median (red: slow), in UTC; a capture
  within one window gets a bar per switch instead (one column says little).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from prism.offline.replay import ReplayResult

__all__ = ["write_plots", "plot_steps", "plot_switches", "steps_figure", "switches_figure"]

_MARK = {"slow_step": ("v", "tab:red"), "regime_change": ("D", "tab:orange"), "slow_group": ("s", "tab:purple")}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def steps_figure(steps: pd.DataFrame, anomalies: pd.DataFrame | None, switch_window_ns: int | None = None) -> Figure:
    """The step plot as a matplotlib Figure (``plot_steps`` saves it).

    One panel per job: step duration against wall-clock time (UTC), the
    job's anomalies marked on their steps, and switch/link anomalies (no
    job) shaded over their window in every panel. The y axis starts at 0,
    so a millisecond of jitter on a 300 ms step looks like what it is.
    """
    import matplotlib.dates as mdates

    plt = _pyplot()
    jobs = sorted(steps["job_id"].unique())
    fig, axes = plt.subplots(len(jobs), 1, figsize=(10, 1.9 * len(jobs) + 0.8), sharex=True, squeeze=False)
    anomalies = anomalies if anomalies is not None else pd.DataFrame(columns=["kind", "job_id", "step", "start_ns", "subject"])
    fabric = anomalies[anomalies["job_id"].isna() | (anomalies["job_id"].astype(str) == "")]
    span_ns = int(switch_window_ns or 0)
    # the steps' time range: a switch window may reach far past a short capture
    first, last = int(steps["end_ns"].min() - steps["duration_ns"].max()), int(steps["end_ns"].max())
    pad = max((last - first) // 50, 1)
    x_lo, x_hi = pd.Timestamp(first - pad, unit="ns"), pd.Timestamp(last + pad, unit="ns")
    for ax, job in zip(axes[:, 0], jobs):
        s = steps[steps["job_id"] == job]
        when = pd.to_datetime(s["end_ns"].to_numpy(), unit="ns")
        y = s["duration_ns"].to_numpy() / 1e6
        ax.plot(when, y, lw=1, color="tab:blue")
        ax.set_ylim(0, max(float(y.max()) * 1.1, 1e-3))
        ax.set_ylabel("step (ms)")
        ax.set_title(f"{job}: {len(s)} steps, median {np.median(y):,.1f} ms", fontsize=9, loc="left")
        a = anomalies[anomalies["job_id"] == job]
        for kind, g in a.groupby("kind"):
            m, c = _MARK.get(kind, ("o", "k"))
            at = s.set_index("step").reindex(g["step"]).dropna(subset=["end_ns"])
            ax.scatter(pd.to_datetime(at["end_ns"].to_numpy(dtype="int64"), unit="ns"), at["duration_ns"].to_numpy() / 1e6,
                       marker=m, color=c, s=40, zorder=3, label=kind)
        for r in fabric.itertuples(index=False):
            lo = pd.Timestamp(max(int(r.start_ns), first - pad), unit="ns")
            hi = pd.Timestamp(min(int(r.start_ns) + max(span_ns, 1), last + pad), unit="ns")
            ax.axvspan(lo, max(hi, lo), color="tab:red", alpha=0.12, lw=0, label=f"{r.kind} {r.subject}")
        ax.set_xlim(x_lo, x_hi)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            uniq = dict(zip(labels, handles))
            ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower left")
    ax = axes[-1, 0]
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    ax.set_xlabel(f"time (UTC, {pd.Timestamp(int(steps['end_ns'].min()), unit='ns'):%Y-%m-%d})")
    fig.tight_layout()
    return fig


def plot_steps(steps: pd.DataFrame | None, anomalies: pd.DataFrame | None, path: Path, switch_window_ns: int | None = None) -> Path | None:
    """Write ``steps_figure`` to ``path`` (None when there are no steps)."""
    if steps is None or steps.empty:
        return None
    fig = steps_figure(steps, anomalies, switch_window_ns)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def switches_figure(bandwidth: pd.DataFrame | None, window_ns: int | None = None) -> Figure | None:
    """Heat map, switch x window, of bandwidth over the tier's median (None without switch rows).

    Columns are labelled with the window's start in UTC (seconds shown when
    windows are shorter than a minute), at most about 12 labels.
    """
    sw = bandwidth[bandwidth["kind"] == "switch"] if bandwidth is not None else None
    if sw is None or sw.empty:
        return None
    plt = _pyplot()
    grid = sw.pivot_table(index=["tier", "name"], columns="window_start_ns", values="ratio")
    if grid.shape[1] == 1:
        return _one_window(plt, grid, window_ns)
    fig, ax = plt.subplots(figsize=(min(max(4, 0.5 * grid.shape[1] + 3), 16), 0.22 * len(grid) + 1.4))
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn", vmin=0, vmax=1.2, interpolation="nearest")
    ax.set_yticks(range(len(grid)), [f"{n} ({t})" for t, n in grid.index], fontsize=6)
    starts = pd.to_datetime(np.asarray(grid.columns, dtype="int64"), unit="ns")
    step = int(window_ns) if window_ns else (int(np.diff(np.asarray(grid.columns, dtype="int64")).min()) if grid.shape[1] > 1 else 60 * 10**9)
    fmt = "%H:%M" if step >= 60 * 10**9 else "%H:%M:%S"
    every = max(1, int(np.ceil(grid.shape[1] / 12)))
    ticks = list(range(0, grid.shape[1], every))
    ax.set_xticks(ticks, [starts[i].strftime(fmt) for i in ticks], fontsize=7)
    ax.set_xlabel(f"window start (UTC, {starts[0]:%Y-%m-%d}; windows of {step / 1e9:g} s)")
    fig.colorbar(im, ax=ax, label="bandwidth / tier median")
    ax.set_title("switch effective bandwidth (red: slow)", fontsize=9)
    fig.tight_layout()
    return fig


def _one_window(plt, grid: pd.DataFrame, window_ns: int | None) -> Figure:
    """A capture within one switch window: a bar per switch (a heat map of one column says little)."""
    ratio = grid.iloc[:, 0].to_numpy(dtype=float)
    start = pd.Timestamp(int(grid.columns[0]), unit="ns")
    fig, ax = plt.subplots(figsize=(6, 0.22 * len(grid) + 1.6))
    ax.barh(range(len(grid)), np.nan_to_num(ratio), color=plt.get_cmap("RdYlGn")(np.clip(np.nan_to_num(ratio) / 1.2, 0, 1)))
    ax.set_yticks(range(len(grid)), [f"{n} ({t})" for t, n in grid.index], fontsize=6)
    ax.set_ylim(len(grid) - 0.5, -0.5)
    ax.axvline(1.0, color="grey", lw=0.8)
    ax.set_xlim(0, max(1.2, float(np.nanmax(ratio)) * 1.05 if np.isfinite(ratio).any() else 1.2))
    ax.set_xlabel("bandwidth / tier median")
    span = f"one window of {window_ns / 1e9:g} s" if window_ns else "one window"
    ax.set_title(f"switch effective bandwidth (red: slow)\n{span} from {start:%Y-%m-%d %H:%M:%S} UTC\n"
                 "(a shorter --switch-window gives a time axis)", fontsize=7)
    fig.tight_layout()
    return fig


def plot_switches(bandwidth: pd.DataFrame | None, path: Path, window_ns: int | None = None) -> Path | None:
    """Write ``switches_figure`` to ``path`` (None without switch rows)."""
    fig = switches_figure(bandwidth, window_ns)
    if fig is None:
        return None
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def write_plots(res: ReplayResult, out: Path) -> list[Path]:
    """Write the figures of a replay; returns the files written."""
    an = res.analysis
    if an is None:
        return []
    done = [plot_steps(an.steps, an.anomalies, out / "steps.png", res.switch_window_ns), plot_switches(an.switch_bandwidth, out / "switches.png", res.switch_window_ns)]
    return [p for p in done if p is not None]
