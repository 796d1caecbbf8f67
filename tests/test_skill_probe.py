"""The skill-following probe: correct skills from the solver, one real run on the tiny model."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest
from helpers import write_trajectory_step
from transformers import AutoProcessor

from seed_vl.analyzer import parse_analysis
from seed_vl.config import Config, EnvConfig, load_config, save_config
from seed_vl.envs import sokoban
from seed_vl.envs.base import step_route
from seed_vl.policy import Policy
from seed_vl.toy import skill_probe
from seed_vl.toy.lookup_pretraining import (
    copy_document,
    copy_drill,
    lookup_batch,
    lookup_document,
    lookup_drill,
)
from seed_vl.toy.skill_probe import correct_skills, hindsight_skills, measure_skill_following, move_token_gaps
from seed_vl.trajectory import Trajectory, Turn


def test_correct_skills_name_the_solver_route_of_their_own_task():
    env = EnvConfig(name="sokoban_text")
    seeds = [1000, 1001, 1002]
    skills = correct_skills(env, seeds)
    for seed in seeds:
        assert step_route(sokoban.solve(sokoban.generate_room(seed))) in skills[seed]
    assert len(set(skills.values())) == 3


def test_hindsight_skills_describe_each_episode_s_own_moves():
    env = EnvConfig(name="sokoban_text")
    route = sokoban.solve(sokoban.generate_room(1000))
    won, lost = (
        Trajectory("sokoban_text", 1000, "", 0, won=w, turns=[Turn([], "", [], m, True, 0.0) for m in moves])
        for w, moves in ((True, route), (False, route[:1]))
    )
    won_skill, lost_skill = hindsight_skills(env, [won, lost], seed=0)
    assert step_route(route) in won_skill  # the moves it took
    assert "1 moves did not finish" in lost_skill or "Ran out of moves after 1 steps" in lost_skill


def test_analyzer_agreement_counts_usable_and_agreeing_skills_per_outcome():
    env = EnvConfig(name="sokoban_text")
    route = sokoban.solve(sokoban.generate_room(1000))
    won, lost = (Turn([], "", [], m, True, 0.0) for m in route), [Turn([], "", [], route[0], True, 0.0)]
    won = Trajectory("sokoban_text", 1000, "", 0, won=True, turns=list(won), skill=f"Push in order: {step_route(route)}")
    lost = [Trajectory("sokoban_text", 1000, "", 0, won=False, turns=lost, skill=s) for s in ("Avoid walls.", None)]
    measures = skill_probe.analyzer_agreement(env, [won, *lost])
    assert measures == {"valid": 2 / 3, "valid_lost": 1 / 2, "agree": 1 / 3, "agree_won": 1.0}
    assert math.isnan(skill_probe.analyzer_agreement(env, [won])["valid_lost"])


def test_probe_reports_every_condition_on_the_tiny_model(tiny_vl_path, monkeypatch):
    config = load_config(None, [
        f"model.path={tiny_vl_path}", "model.device=cpu", "env.name=sokoban_visual", "env.cell_px=28",
        "env.max_steps=3", "rollout.max_new_tokens=6", "logging.progress=false",
        "rollout.temperature=0.9", "eval.temperature=0.4",
    ])
    policy = Policy.from_config(config.model, trainable=False)
    calls = []

    def spy(policy, episodes, skills, temperature):
        calls.append((episodes, skills, temperature))
        return move_token_gaps(policy, episodes, skills, temperature=temperature)

    monkeypatch.setattr(skill_probe, "move_token_gaps", spy)
    metrics = measure_skill_following(policy, config, config.env, num_tasks=3)
    # Scored as the trainer scores: at the rollout temperature, not the eval's. Per outcome: the no-skill
    # episodes with their own hindsight skill, then the correct-skill episodes with the skill they were shown.
    assert [temperature for *_, temperature in calls] == [0.9] * 4
    for episodes, skills, _ in calls[1::2]:
        assert skills == [correct_skills(config.env, [e.seed])[e.seed] for e in episodes]
    for episodes, skills, _ in calls[::2]:
        assert skills == hindsight_skills(config.env, episodes, seed=config.warmstart.seed)
    assert {f"success/{c}" for c in ("none", "correct", "wrong")} <= set(metrics)
    assert all(0.0 <= metrics[f"success/{c}"] <= 1.0 for c in ("none", "correct", "wrong"))
    for outcome in ("won", "lost"):
        for suffix in ("", "_correct"):
            gate = metrics[f"gate{suffix}/{outcome}"]
            assert math.isnan(gate) == (metrics[f"move_tokens{suffix}/{outcome}"] == 0)
            assert math.isnan(gate) or 0.0 < gate < 1.0


def test_lookup_documents_label_only_the_looked_up_moves(tiny_vl_path):
    """Lookup pretraining's documents: a route, then lookups; the loss falls on each looked-up move only."""
    tokenizer = AutoProcessor.from_pretrained(tiny_vl_path).tokenizer
    ids, labels = lookup_document(tokenizer, random.Random(0), lookups=4)
    text = tokenizer.decode(ids)
    route = dict(re.findall(r"step (\d+) (\w+)", text.split("]")[0]))
    asked = re.findall(r"at step (\d+)</think><action>(\w+)</action>", text)
    assert len(asked) == 4 and all(route[k] == move for k, move in asked)
    labelled = [tokenizer.decode([t]) for t, label in zip(ids, labels, strict=True) if label != -100]
    assert labelled == [move for _, move in asked] and all(label in (-100, t) for t, label in zip(ids, labels, strict=True))


def test_copy_documents_label_the_quote_from_its_first_move_to_the_end(tiny_vl_path):
    """Copy documents: the analyzer prompt's actions line, then a winning skill quoting the same route; the
    loss falls on the quote from its first move on (so the model learns where it ends), never on the
    actions line."""
    tokenizer = AutoProcessor.from_pretrained(tiny_vl_path).tokenizer
    phrasings = set()
    for seed in range(12):
        ids, labels = copy_document(tokenizer, random.Random(seed))
        text = tokenizer.decode(ids)
        actions, skill = text.split("\n")[:2]
        route = actions.removeprefix("Actions taken: ")
        assert re.fullmatch(r"step 1 \w+(, step \d+ \w+)*", route) and route in skill
        phrasings.add(skill.split("step 1")[0])
        first = next(k for k, label in enumerate(labels) if label != -100)
        assert all(label == token for token, label in zip(ids[first:], labels[first:], strict=True))
        labelled = tokenizer.decode(ids[first:])
        assert labelled.strip().startswith(route.removeprefix("step 1 ")) and labelled.endswith('"}\n')
    assert len(phrasings) == 3  # every winning-skill phrasing of the Sokoban env


def test_lookup_batches_count_each_kind_of_document(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    loss, counts = lookup_batch(policy.model, policy.tokenizer, random.Random(0), 4)
    assert loss.item() > 0 and set(counts) == {"lookup", "copy"}
    assert all(0 <= right <= total and total > 0 for right, total in counts.values())


def test_copy_drills_answer_with_a_skill_quoting_the_actions():
    for seed in range(6):
        example = copy_drill(random.Random(seed))
        route = example.context[0]["content"].split("Actions taken: ")[1]
        summary, skill = parse_analysis(example.response, min_words=5)
        assert route in skill and summary.startswith("Solved the room in")


def test_lookup_drills_answer_each_looked_up_step_with_its_move():
    example = lookup_drill(random.Random(0), lookups=3)
    (message,) = example.context
    route = dict(re.findall(r"step (\d+) (\w+)", message["content"].split("[")[1]))
    asked = re.findall(r"<think>I push the box at step (\d+)</think><action>(\w+)</action>", example.response)
    assert len(asked) == 3 and len(set(asked)) == 3 and all(route[k] == move for k, move in asked)


def test_lookup_probe_trains_and_reports_accuracy(tiny_vl_path, tmp_path, capsys, script_module):
    probe = script_module("lookup_probe")
    assert probe.main(["--model", tiny_vl_path, "--steps", "2", "--batch", "2"]) == 0
    assert "move accuracy" in capsys.readouterr().out
    assert probe.main(["--model", tiny_vl_path, "--steps", "0"]) == 0
    measured = re.search(r"move accuracy lookup ([\d.]+), copy ([\d.]+) \(chance 0.250\), no training", capsys.readouterr().out)
    assert measured and 0.0 <= float(measured[1]) <= 1.0 and 0.0 <= float(measured[2]) <= 1.0
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--model", tiny_vl_path, "--steps", "-1"])
    assert exit_info.value.code == 2 and "--steps: must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--model", str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and "--model: no model at" in capsys.readouterr().err


def test_copy_probe_counts_each_format_by_route_length(tiny_vl_path, tmp_path, capsys, script_module):
    probe = script_module("copy_probe")
    recipe = str(Path(__file__).parents[1] / "configs" / "tiny" / "sokoban_visual.yaml")
    assert probe.main(["--model", tiny_vl_path, "--examples", "6", "--config", recipe, "env.cell_px=28"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["document", "drill", "analyzer"]
    totals = []
    for line in lines:
        cells = re.findall(r"(\d+)\+?: (\d+)/(\d+)", line.split("length: ", 1)[1])
        totals.append(sum(int(total) for _, _, total in cells))
        assert all(int(right) <= int(total) for _, right, total in cells)
    assert totals[:2] == [6, 6] and 1 <= totals[2] <= 6  # the analyzer's: the won ones of 6 episodes
    assert probe.main(["--model", tiny_vl_path, "--config", recipe, "env.cell_px=-1"]) == 2
    assert "env.cell_px" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--model", str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and "--model: no model at" in capsys.readouterr().err


def test_copy_probe_on_a_run_counts_won_episodes_whose_skill_quotes_their_route(tmp_path, script_module, capsys):
    """A hand-built run on the real env: solver wins with a skill that quotes the route, one that does not,
    and a lost episode, which is not counted."""
    plans = {}
    for seed in range(200):
        plan = sokoban.solve(sokoban.generate_room(seed, (6, 6), 1, 30))
        plans.setdefault(min(len(plan), 2), (seed, plan))
    (one_seed, one), (long_seed, long) = plans[1], plans[2]

    def record(seed, won, actions, skill):
        turns = [{"response_text": "", "response_ids": [1], "action": a, "action_valid": True, "reward": 0.0} for a in actions]
        return {"seed": seed, "group_id": 0, "won": won, "episode_return": 0.0, "turns": turns, "skill": skill}

    records = [
        record(one_seed, True, one, f"Winning order: {step_route(one)}."),
        record(long_seed, True, long, f"Winning order: {step_route(long)}."),
        record(long_seed, True, long, "Winning order: step 1 up."),
        record(long_seed, True, long, None),
        record(long_seed, False, long[:1], f"Winning order: {step_route(long)}."),
    ]
    write_trajectory_step(tmp_path, 1, records)
    save_config(Config.model_validate({"env": {"name": "sokoban_text"}}), tmp_path / "config.yaml")
    probe = script_module("copy_probe")
    assert probe.main(["--run", str(tmp_path)]) == 0
    n = min(len(long), 7)
    assert capsys.readouterr().out.strip().endswith(f"1: 1/1, {n}{'+' if n == 7 else ''}: 1/3")
    assert probe.main(["--run", str(tmp_path / "missing")]) == 2
    assert "error:" in capsys.readouterr().err
    assert probe.main(["--run", str(tmp_path), "--steps", "1"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"1: 1/1, {n}{'+' if n == 7 else ''}: 1/3")
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--run", str(tmp_path), "--steps", "-1"])  # a negative slice would drop the last updates
    assert exit_info.value.code == 2 and "--steps: must be >= 1" in capsys.readouterr().err
