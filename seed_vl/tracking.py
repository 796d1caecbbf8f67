"""Metrics and progress: a JSONL file per run, progress bars on a terminal, wandb when enabled.

Only the main process logs. wandb runs offline when no API key is set, and only ever sees the redacted config.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel
from tqdm.auto import tqdm

from seed_vl.config import to_dict
from seed_vl.io import append_jsonl

T = TypeVar("T")


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
        self.path = Path(run_dir) / "metrics.jsonl"
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

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def progress(items: Iterable[T], desc: str, total: int | None = None, enabled: bool = True) -> Iterator[T]:
    """A tqdm bar on a terminal; one plain line per phase (start and end) when output is not a TTY."""
    if not enabled:
        yield from items
        return
    if sys.stderr.isatty():
        yield from tqdm(items, desc=desc, total=total, leave=False, dynamic_ncols=True)
        return
    start = time.perf_counter()
    count = 0
    for count, item in enumerate(items, 1):  # noqa: B007
        yield item
    print(f"[seed-vl] {desc}: {count} done in {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
