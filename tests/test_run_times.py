"""scripts/run_times.py on hand-written metrics: phase means per update, seconds per environment step, the
held-out curve, and one-line errors. Metrics are read as the trainer's reader does (`tracking.read_metrics`):
a step logged again by a resumed run counts once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run_times.py"), *args],
                          capture_output=True, text=True)


def test_phase_means_seconds_per_step_and_the_curve(tmp_path):
    rows = [
        {"step": 0, "eval/success_rate": 0.25},
        {"step": 1, "env_steps": 100, "time/rollout": 2.0, "time/scoring": 1.0, "time/update": 3.0},
        {"step": 2, "env_steps": 300, "time/rollout": 4.0, "time/analysis": 2.0, "time/scoring": 1.0,
         "time/update": 5.0},
        {"step": 2, "env_steps": 300, "time/rollout": 4.0, "time/analysis": 2.0, "time/scoring": 1.0,
         "time/update": 5.0, "eval/success_rate": 0.5},  # step 2 again, as a resumed run logs it
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _run(str(tmp_path))
    assert result.returncode == 0, result.stderr
    # (2+4)/2, (0+2)/2, (1+1)/2, (3+5)/2 seconds per update; 18 seconds over 300 environment steps.
    assert f"| {tmp_path} | 2 | 300 | 3.0 | 1.0 | 1.0 | 4.0 | 0.060 | 25.0 (0), 50.0 (2) |" in result.stdout


def test_bad_runs_give_one_line_errors(tmp_path):
    missing = _run(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "has no metrics.jsonl" in missing.stderr
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "eval/success_rate": 0.25}\n')
    no_updates = _run(str(tmp_path))
    assert no_updates.returncode == 2 and "no update rows" in no_updates.stderr
