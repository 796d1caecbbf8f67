"""Learning curves: one panel per metric against environment steps, one line per run label.

Each panel of metric `k` draws `train/k` (solid), `eval/k` (dashed, with markers; the step-0 evaluation
sits at 0 environment steps) and a plain `k` where a run logs one (e.g. `gate_mean`). Runs that share a
label - seeds of one recipe - become their mean with a min-max band, after interpolation onto the
environment steps they all cover. Figure size and dpi are fixed, so the PNG size is known.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from matplotlib.figure import Figure

from seed_vl.config import ConfigError
from seed_vl.io import atomic_write_bytes
from seed_vl.tracking import read_metrics

DEFAULT_METRICS = ("success_rate", "return")
PANEL_PX = (560, 420)  # width, height of one panel in the PNG
DPI = 100
# Key prefix -> line style: training curves solid, evaluations dashed with markers, unprefixed keys solid.
SERIES: dict[str, dict[str, Any]] = {
    "train/": {},
    "eval/": {"linestyle": "--", "marker": "o", "markersize": 4},
    "": {},
}


@dataclass
class Run:
    """One run (a run directory, or a reproduction's record of one): its label and its metrics records, one per
    step (the last one written wins)."""

    path: Path
    label: str
    records: list[dict[str, Any]]

    def curve(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(env_steps, value) of every record that logged `key` with a finite value."""
        points = [
            (record.get("env_steps", 0), record[key])
            for record in self.records
            if _is_finite(record.get(key)) and ("env_steps" in record or record["step"] == 0)
        ]
        x, y = zip(*points, strict=True) if points else ((), ())
        return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def load_run(run_dir: str | Path, label: str | None = None) -> Run:
    """A run's metrics (`tracking.read_metrics`) and, without `label`, its name `<algorithm.preset> /
    <env.name>` from its config.yaml."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ConfigError(f"run directory not found: {path}")
    return Run(path, label or _default_label(path), read_metrics(path))


def _default_label(run_dir: Path) -> str:
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        return run_dir.name
    try:
        config = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
        return f"{config['algorithm']['preset']} / {config['env']['name']}"
    except (yaml.YAMLError, KeyError, TypeError):
        raise ConfigError(f"{config_file} names no algorithm.preset and env.name; pass --label") from None


def aggregate(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], label: str = ""
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, mean, min, max) across non-empty `curves`, on the union of their x values inside the range
    they all cover."""
    start, end = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
    if start > end:
        raise ConfigError(f"runs labelled '{label}' cover disjoint environment-step ranges; label them apart")
    grid = np.unique(np.concatenate([x for x, _ in curves]))
    grid = grid[(grid >= start) & (grid <= end)]
    ys = np.stack([np.interp(grid, x, y) for x, y in curves])
    return grid, ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def plot_runs(
    run_dirs: Sequence[str | Path],
    out_png: str | Path,
    labels: Sequence[str] | None = None,
    metric_keys: Sequence[str] = DEFAULT_METRICS,
) -> Path:
    """Plot `metric_keys` of `run_dirs` (one panel each) into `out_png`; `labels` (one per run) replaces
    the config-derived labels, and runs sharing a label are aggregated."""
    if not run_dirs or not metric_keys:
        raise ConfigError("plot_runs needs at least one run directory and one metric")
    if labels is not None and len(labels) != len(run_dirs):
        raise ConfigError(
            f"got {len(labels)} labels for {len(run_dirs)} run directories: give one label per run"
        )
    return draw_runs([load_run(d, labels[i] if labels else None) for i, d in enumerate(run_dirs)], out_png, metric_keys)


def draw_runs(runs: Sequence[Run], out_png: str | Path, metric_keys: Sequence[str] = DEFAULT_METRICS) -> Path:
    """Plot already loaded runs (e.g. a reproduction's committed run records); runs sharing a label are
    aggregated."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.label, []).append(run)

    width, height = PANEL_PX[0] * len(metric_keys), PANEL_PX[1]
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    axes = fig.subplots(1, len(metric_keys), squeeze=False)[0]
    for ax, metric in zip(axes, metric_keys, strict=True):
        drawn = [
            _draw_series(ax, prefix + metric, label, members, color=f"C{index % 10}", **style)
            for index, (label, members) in enumerate(groups.items())
            for prefix, style in SERIES.items()
        ]
        if not any(drawn):
            looked_for = ", ".join(prefix + metric for prefix in SERIES)
            raise ConfigError(f"no run logged metric '{metric}' (looked for {looked_for})")
        ax.set(title=metric.replace("_", " "), xlabel="environment steps")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    atomic_write_bytes(out_png, buf.getvalue())
    return Path(out_png)


def _draw_series(ax, key: str, label: str, members: list[Run], **style: Any) -> bool:
    """Draw `key` of one label's runs (mean line, min-max band when several); False if none logged it."""
    curves = [curve for curve in (run.curve(key) for run in members) if len(curve[0])]
    if not curves:
        return False
    x, mean, low, high = aggregate(curves, label)
    kind = key.split("/")[0] if "/" in key else key
    name = f"{label} · {kind}" + (f" (mean of {len(curves)}, min-max)" if len(curves) > 1 else "")
    ax.plot(x, mean, label=name, **style)
    if len(curves) > 1:
        ax.fill_between(x, low, high, color=style["color"], alpha=0.2, linewidth=0)
    return True


def _is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
