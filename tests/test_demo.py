"""The CPU demo on a reduced budget through the CLI, and every recipe under configs/ loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from seed_vl.checkpoint import list_checkpoints
from seed_vl.cli import main
from seed_vl.config import load_config
from seed_vl.toy.demo import DEFAULT_RECIPE
from seed_vl.toy.reproduce import ReproduceConfig, base_config
from seed_vl.toy.warmstart import warmstart_settings

REPO = Path(__file__).resolve().parents[1]
RECIPES = sorted((REPO / "configs").glob("*/*.yaml"))
NOT_RECIPES = {"accelerate"}  # launcher configs for `accelerate launch`, not seed-vl recipes


def reduced_demo(tmp: Path) -> list[str]:
    """The demo recipe with a warm start of a few examples and one RL step on two short tasks."""
    return [
        f"warmstart.base_model={tmp / 'tiny-vl'}",
        f"warmstart.out_dir={tmp / 'warmstart'}",
        "warmstart.demonstrations=2",
        "warmstart.analyzer_episodes=2",
        "warmstart.epochs=1",
        "warmstart.lookup_steps=2",
        "warmstart.lookup_drills=2",
        "warmstart.perception_steps=2",
        "warmstart.perception_states=4",
        "warmstart.perception_drills=2",
        "warmstart.perception_skill_turns=4",
        "warmstart.skill_drills=2",
        "env.max_steps=5",
        "rollout.num_tasks=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "analyzer.max_new_tokens=12",
        "analyzer.attempts=1",
        "train.steps=1",
        "eval.num_tasks=2",
        f"train.output_dir={tmp / 'runs'}",
        "logging.progress=false",
    ]


def test_demo_writes_every_output_and_prints_before_and_after(tmp_path, capsys):
    assert main(["demo", *reduced_demo(tmp_path)]) == 0
    out = capsys.readouterr().out

    run_dir = tmp_path / "runs" / load_config(DEFAULT_RECIPE).train.run_name
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1]
    assert all("eval/success_rate" in r for r in records)
    assert [c.name for c in list_checkpoints(run_dir / "checkpoints")] and (run_dir / "checkpoints").is_dir()
    report = run_dir / "report_step_1.html"
    assert report.is_file() and "<html" in report.read_text().lower()
    assert (run_dir / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "warmstart" / "model" / "config.json").is_file()

    before = re.search(r"before RL \(step 0\):\s+([\d.]+)%", out)
    after = re.search(r"after RL\s+\(step 1\):\s+([\d.]+)%", out)
    assert before and after
    assert float(before[1]) == pytest.approx(100 * records[0]["eval/success_rate"], abs=0.05)
    assert float(after[1]) == pytest.approx(100 * records[1]["eval/success_rate"], abs=0.05)
    assert str(run_dir) in out and "learning_curve.png" in out and report.name in out

    # A second demo reuses the warm start and writes a fresh run directory next to the first.
    assert main(["demo", *reduced_demo(tmp_path)]) == 0
    assert "reusing" in capsys.readouterr().err
    assert (run_dir.parent / f"{run_dir.name}-2" / "metrics.jsonl").is_file()
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2  # the first run is untouched


def test_a_bad_override_is_a_one_line_error(tmp_path, capsys):
    assert main(["demo", "warmstart.epochs=0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warmstart.epochs" in err


@pytest.mark.parametrize(
    "recipe",
    [r for r in RECIPES if r.parent.name not in NOT_RECIPES],
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_every_recipe_loads(recipe):
    if recipe.parent.name == "reproduce":  # a reproduction's own schema, naming training recipes
        config = load_config(recipe, schema=ReproduceConfig)
        for task, path in config.tasks.items():  # every run's settings, and the shared base's warm start
            load_config(REPO / path, [*config.overrides, *config.task_overrides.get(task, [])])
        base_config(config)
        return
    config = load_config(recipe)
    if recipe.parent.name == "tiny":  # trains what its warm start writes, on the CPU
        assert Path(config.model.path) == Path(config.warmstart.out_dir) / "model"
        assert config.model.device == "cpu"


def test_tiny_recipes_sharing_a_warm_start_directory_agree_on_its_settings():
    """Each tiny recipe warm-starts its own environment; recipes that share a cache directory (the text ones)
    have the same settings, so that neither rebuilds the other's warm start."""
    by_dir: dict[str, list] = {}
    for recipe in sorted((REPO / "configs" / "tiny").glob("*.yaml")):
        config = load_config(recipe)
        assert config.env.name in config.warmstart.envs, recipe.name
        by_dir.setdefault(config.warmstart.out_dir, []).append(config)
    assert any(len(configs) > 1 for configs in by_dir.values())  # the text recipes share one
    for configs in by_dir.values():
        assert all(warmstart_settings(c) == warmstart_settings(configs[0]) for c in configs)
