"""Metrics and progress: a JSONL file per run, progress bars on a terminal, wandb when enabled.

Only the main process logs. wandb runs offline when no API key is set, and only ever sees the redacted config.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from tqdm.auto import tqdm

from seed_vl.config import ConfigError, to_dict
from seed_vl.io import append_jsonl, atomic_write_text, read_jsonl

T = TypeVar("T")
METRICS_FILE = "metrics.jsonl"


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """A run's metrics.jsonl, one record per step in step order: a torn or bad line (a live run being
    written) is skipped with a warning, and a step logged twice keeps its last record."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir} has no {METRICS_FILE}")
    records = read_jsonl(path, on_bad_line=lambda n, _: warnings.warn(f"{path}:{n}: skipped a bad line", stacklevel=3))
    by_step = {record["step"]: record for record in records if isinstance(record.get("step"), int)}
    return [by_step[step] for step in sorted(by_step)]


class MetricsLogger:
    def __init__(
        self,
        run_dir: str | Path,
        config: BaseModel,
        *,
        enabled: bool = True,
        use_wandb: bool = False,
        project: str = "seed-vl",
        run_name: str = "",
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.enabled = enabled
        self._wandb = None
        if enabled and use_wandb:
            import wandb

            if not os.environ.get("WANDB_API_KEY") and "WANDB_MODE" not in os.environ:
                os.environ["WANDB_MODE"] = "offline"
            self._wandb = wandb.init(
                project=project, name=run_name or None, dir=str(run_dir), config=to_dict(config, redact=True)
            )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        append_jsonl(self.path, {"step": step, **metrics})
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def rewrite(self, records: list[dict[str, Any]]) -> None:
        """Replace metrics.jsonl with `records` (a resumed run; trackers keep what they already have)."""
        if self.enabled:
            atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class Phase:
    """Progress of one phase of a step: a tqdm bar on a terminal; otherwise (a log file) one plain line at
    the end, and one every `line_every_s` seconds while a long phase runs, so a log shows where an hour-long
    warm start is.

        with Phase("step 3 rollout", total=32, unit="episodes") as bar:
            ...; bar.update(1)
    """

    line_every_s: float = 300.0

    def __init__(self, desc: str, total: int | None = None, unit: str = "items", enabled: bool = True) -> None:
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.count = 0
        self.seconds = 0.0
        self._bar = None

    def __enter__(self) -> Phase:
        self._start = self._last_line = time.perf_counter()
        if self.enabled and sys.stderr.isatty():
            self._bar = tqdm(total=self.total, desc=self.desc, unit=self.unit, leave=False, dynamic_ncols=True)
        return self

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.enabled and (now := time.perf_counter()) - self._last_line >= self.line_every_s:
            self._last_line = now
            of_total = f"/{self.total}" if self.total is not None else ""
            print(f"[seed-vl] {self.desc}: {self.count}{of_total} {self.unit} after {now - self._start:.0f}s",
                  file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._start
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and exc[0] is None:
            print(f"[seed-vl] {self.desc}: {self.count} {self.unit} in {self.seconds:.1f}s", file=sys.stderr, flush=True)


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "items", enabled: bool = True) -> Iterator[T]:
    """Iterate with a `Phase`."""
    with Phase(desc, total=total, unit=unit, enabled=enabled) as bar:
        for item in items:
            yield item
            bar.update()
