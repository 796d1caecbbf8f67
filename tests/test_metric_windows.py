"""scripts/metric_windows.py on hand-written metrics: the mean of each metric per window of updates, rows
that lack a metric (evaluation rows) skipped, a resumed step counted once, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "metric_windows.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_means_per_window_of_updates(tmp_path):
    rows = [{"step": 0, "eval/success_rate": 0.25}]  # no training metric: not an update
    rows += [{"step": s, "entropy": 0.1 * s, "train/invalid_action_rate": 0.5 if s == 5 else 0.0} for s in range(1, 6)]
    rows.append({"step": 5, "entropy": 0.9, "train/invalid_action_rate": 1.0})  # step 5 again, as a resumed run logs it
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _run(str(tmp_path), "--metric", "entropy", "--metric", "train/invalid_action_rate", "--window", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "| run | updates | entropy | train/invalid_action_rate |"
    # updates 1-2: (0.1+0.2)/2; 3-4: (0.3+0.4)/2; 5 alone, its last record
    assert lines[2:] == [f"| {tmp_path} | 1-2 | 0.150 | 0.000 |", f"| {tmp_path} | 3-4 | 0.350 | 0.000 |",
                         f"| {tmp_path} | 5-5 | 0.900 | 1.000 |"]


def test_bad_input_gives_one_line_errors(tmp_path):
    missing = _run(str(tmp_path / "nowhere"), "--metric", "entropy")
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "has no metrics.jsonl" in missing.stderr
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "entropy": 0.3}\n')
    unknown = _run(str(tmp_path), "--metric", "entrpy")
    assert unknown.returncode == 2 and unknown.stderr.count("\n") == 1 and "entrpy" in unknown.stderr
    window = _run(str(tmp_path), "--metric", "entropy", "--window", "0")
    assert window.returncode == 2 and "--window" in window.stderr.strip().splitlines()[-1]
