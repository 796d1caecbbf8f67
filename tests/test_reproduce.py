"""`seed-vl reproduce` on a minimal budget: every run trains, the RESULTS table and figures are written."""

from __future__ import annotations

import json

import pytest

from seed_vl.config import ConfigError
from seed_vl.reproduce import reproduce


def test_reproduce_on_a_minimal_budget_writes_results(tmp_path, tiny_vl_path):
    run_overrides = [
        f"warmstart.base_model={tiny_vl_path}",
        "warmstart.demonstrations=2", "warmstart.analyzer_episodes=0", "warmstart.epochs=1",
        "model.device=cpu", "train.steps=2", "rollout.num_tasks=1",
        "rollout.group_size=2", "env.max_steps=2", "eval.num_tasks=1", "eval.every=1", "logging.progress=false",
        "checkpoint.every=0",
    ]
    results = reproduce(None, [
        f"overrides={json.dumps(run_overrides)}", "methods=[grpo, seed]", "seeds=[0, 1]",
        f"output_dir={tmp_path / 'runs'}", f"results={tmp_path / 'RESULTS.md'}",
        f"figures_dir={tmp_path / 'figures'}",
    ])

    text = results.read_text()
    assert "| GRPO |" in text and "| SEED |" in text
    assert "| Method | Sokoban | EZPoints |" in text
    assert "Environment steps to reach GRPO's final success rate" in text
    for task in ("sokoban", "ezpoints"):
        assert (tmp_path / "figures" / f"reproduce_{task}.png").stat().st_size > 0
        for method in ("grpo", "seed"):
            for seed in (0, 1):
                assert (tmp_path / "runs" / f"{task}-{method}-seed{seed}" / "metrics.jsonl").is_file()
    summary = json.loads(results.with_suffix(".json").read_text())
    assert len(summary) == 2 * 2 * 2
    assert all(0.0 <= r["final_success"] <= 1.0 for r in summary)

    # A second call reuses every finished run (and the cached warm start) and rewrites the same table.
    mtime = (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime
    reproduce(None, [
        f"overrides={json.dumps(run_overrides)}", "methods=[grpo, seed]", "seeds=[0, 1]",
        f"output_dir={tmp_path / 'runs'}", f"results={tmp_path / 'RESULTS.md'}",
        f"figures_dir={tmp_path / 'figures'}",
    ])
    assert (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime == mtime

    # Other warm-start settings would rebuild the shared base under the finished runs: refused, nothing lost.
    with pytest.raises(ConfigError, match="finished runs started from a warm start"):
        reproduce(None, [
            f"overrides={json.dumps([*run_overrides, 'warmstart.seed=1'])}", "methods=[grpo, seed]",
            "seeds=[0, 1]", f"output_dir={tmp_path / 'runs'}", f"results={tmp_path / 'RESULTS.md'}",
            f"figures_dir={tmp_path / 'figures'}",
        ])
    assert (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime == mtime
