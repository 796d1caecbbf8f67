"""Run plots: run directories written by the real config and metrics writers, plotted to PNG and read back."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from seed_vl.config import ConfigError, load_config, save_config
from seed_vl.plots import PANEL_PX, aggregate, load_run, plot_runs
from seed_vl.tracking import MetricsLogger

ROOT = Path(__file__).resolve().parents[1]
C0, C1 = (31, 119, 180), (255, 127, 14)  # matplotlib's first two cycle colors: the first two labels


def write_run(run_dir: Path, preset: str, seed: int, steps_per_update: int, updates: int = 6) -> Path:
    """A run directory as the trainer leaves it: config.yaml and metrics.jsonl (eval at steps 0 and 3)."""
    config = load_config(
        overrides=[f"algorithm.preset={preset}", f"train.seed={seed}", "env.name=sokoban_visual"]
    )
    save_config(config, run_dir / "config.yaml")
    logger, rng = MetricsLogger(run_dir, config), np.random.default_rng(seed)
    logger.log(0, {"eval/success_rate": 0.0, "eval/return": -1.5})
    for step in range(1, updates + 1):
        success = min(1.0, step / updates + rng.uniform(-0.1, 0.1))
        metrics = {
            "env_steps": step * steps_per_update,
            "train/success_rate": success,
            "train/return": 10 * success,
        }
        if step % 3 == 0:
            metrics |= {"eval/success_rate": success, "eval/return": 10 * success}
        logger.log(step, metrics)
    return run_dir


def pixels_near(png: Path, rgb: tuple[int, int, int], tolerance: int = 12) -> int:
    image = np.asarray(Image.open(png).convert("RGB"), dtype=int)
    return int((np.abs(image - np.array(rgb)).max(axis=-1) <= tolerance).sum())


def test_plot_script_writes_a_png_of_the_right_size_from_two_runs(tmp_path):
    runs = [write_run(tmp_path / "seed", "seed", 0, 12), write_run(tmp_path / "grpo", "grpo", 0, 10)]
    out = tmp_path / "plots" / "curves.png"
    cli = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plot_runs.py"), *map(str, runs), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    assert Image.open(out).size == (2 * PANEL_PX[0], PANEL_PX[1])  # two panels: success rate, return
    three = plot_runs(runs, tmp_path / "three.png", metric_keys=("success_rate", "return", "success_rate"))
    assert Image.open(three).size == (3 * PANEL_PX[0], PANEL_PX[1])


def test_runs_are_labelled_from_their_config_and_a_shared_label_is_one_line(tmp_path):
    seeds = [write_run(tmp_path / f"seed{s}", "seed", s, 12) for s in range(2)]
    grpo = write_run(tmp_path / "grpo", "grpo", 0, 10)
    assert load_run(seeds[0]).label == "seed / sokoban_visual"
    assert load_run(grpo).label == "grpo / sokoban_visual"

    two_labels = plot_runs([*seeds, grpo], tmp_path / "two.png")
    assert pixels_near(two_labels, C0) > 100 and pixels_near(two_labels, C1) > 100
    one_label = plot_runs([*seeds, grpo], tmp_path / "one.png", labels=["all", "all", "all"])
    assert pixels_near(one_label, C0) > 100 and pixels_near(one_label, C1) == 0


def test_aggregate_interpolates_onto_the_range_every_run_covers():
    slow = (np.array([0.0, 10, 20, 30]), np.array([0.0, 1, 2, 3]))  # y = x / 10
    fast = (np.array([0.0, 15, 30, 45]), np.array([0.0, 3, 6, 9]))  # y = x / 5
    x, mean, low, high = aggregate([slow, fast])
    np.testing.assert_array_equal(x, [0, 10, 15, 20, 30])  # 45 lies beyond the slow run
    np.testing.assert_allclose(mean, 0.15 * x)
    np.testing.assert_allclose(low, x / 10)
    np.testing.assert_allclose(high, x / 5)
    with pytest.raises(ConfigError, match="disjoint"):
        aggregate([slow, (fast[0] + 100, fast[1])], "late")


def test_eval_points_sit_at_the_environment_steps_of_their_record(tmp_path):
    run = load_run(write_run(tmp_path / "run", "seed", 0, 12))
    x, y = run.curve("eval/success_rate")
    np.testing.assert_array_equal(x, [0, 36, 72])  # step 0, then steps 3 and 6 at 12 env steps each
    x, _ = run.curve("train/success_rate")
    np.testing.assert_array_equal(x, 12 * np.arange(1, 7))


def test_a_torn_last_line_of_a_live_run_is_skipped(tmp_path):
    run_dir = write_run(tmp_path / "run", "seed", 0, 12)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 7, "env_steps": 8')
    with pytest.warns(UserWarning, match="metrics.jsonl:8"):
        run = load_run(run_dir)
    assert [r["step"] for r in run.records] == list(range(7))


def test_bad_inputs_give_one_line_errors(tmp_path):
    run_dir = write_run(tmp_path / "run", "seed", 0, 12)
    with pytest.raises(ConfigError, match="run directory not found"):
        plot_runs([tmp_path / "missing"], tmp_path / "x.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="has no metrics.jsonl"):
        plot_runs([tmp_path / "empty"], tmp_path / "x.png")
    with pytest.raises(ConfigError, match="2 labels for 1 run"):
        plot_runs([run_dir], tmp_path / "x.png", labels=["a", "b"])
    with pytest.raises(ConfigError, match="no run logged metric 'reward'"):
        plot_runs([run_dir], tmp_path / "x.png", metric_keys=("reward",))
    assert not (tmp_path / "x.png").exists()
