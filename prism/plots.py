"""``prism replay --plots``: PNG figures for people (matplotlib, no screen needed).

- ``steps.png``: step duration over time, one panel per job, anomalies marked;
- ``switches.png``: effective bandwidth of every switch per window, as a
  heat map relative to its tier's median (red: slow).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["write_plots", "plot_steps", "plot_switches"]

_MARK = {"slow_step": ("v", "tab:red"), "regime_change": ("D", "tab:orange"), "slow_group": ("s", "tab:purple")}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only; works without a display
    import matplotlib.pyplot as plt

    return plt


def plot_steps(steps: pd.DataFrame, anomalies: pd.DataFrame, path: Path, t0_ns: int) -> Path | None:
    """Step duration (ms) against time (s from ``t0_ns``) per job."""
    if steps is None or steps.empty:
        return None
    plt = _pyplot()
    jobs = sorted(steps["job_id"].unique())
    fig, axes = plt.subplots(len(jobs), 1, figsize=(10, 1.9 * len(jobs) + 0.6), sharex=True, squeeze=False)
    for ax, job in zip(axes[:, 0], jobs):
        s = steps[steps["job_id"] == job]
        x = (s["end_ns"].to_numpy() - t0_ns) / 1e9
        y = s["duration_ns"].to_numpy() / 1e6
        ax.plot(x, y, lw=1, color="tab:blue")
        ax.set_ylabel("ms")
        ax.set_title(f"{job}: {len(s)} steps, median {np.median(y):,.1f} ms", fontsize=9, loc="left")
        a = anomalies[anomalies["job_id"] == job] if anomalies is not None else pd.DataFrame()
        for kind, g in a.groupby("kind"):
            m, c = _MARK.get(kind, ("o", "k"))
            at = s.set_index("step").reindex(g["step"])
            ax.scatter((at["end_ns"].to_numpy() - t0_ns) / 1e9, at["duration_ns"].to_numpy() / 1e6, marker=m, color=c, s=40, zorder=3, label=kind)
        if len(a):
            ax.legend(fontsize=7, loc="upper left")
    axes[-1, 0].set_xlabel("time (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_switches(bandwidth: pd.DataFrame, path: Path) -> Path | None:
    """Heat map: switch x window, bandwidth / tier median."""
    if bandwidth is None or bandwidth.empty:
        return None
    sw = bandwidth[bandwidth["kind"] == "switch"]
    if sw.empty:
        return None
    plt = _pyplot()
    grid = sw.pivot_table(index=["tier", "name"], columns="window_start_ns", values="ratio")
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * grid.shape[1] + 3), 0.22 * len(grid) + 1.2))
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", cmap="RdYlGn", vmin=0, vmax=1.2)
    ax.set_yticks(range(len(grid)), [f"{n} ({t})" for t, n in grid.index], fontsize=6)
    ax.set_xticks(range(grid.shape[1]), [pd.Timestamp(int(w)).strftime("%H:%M") for w in grid.columns], fontsize=7)
    ax.set_xlabel("window start (UTC)")
    fig.colorbar(im, ax=ax, label="bandwidth / tier median")
    ax.set_title("switch effective bandwidth", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(res, out: Path) -> list[Path]:
    """Write the figures of a replay; returns the files written."""
    an = res.analysis
    if an is None:
        return []
    done = [plot_steps(an.steps, an.anomalies, out / "steps.png", int(res.first_ns or 0)), plot_switches(an.switch_bandwidth, out / "switches.png")]
    return [p for p in done if p is not None]
