"""Perception pretraining: final pushes in the policy's own first-turn prompt, skill turns with the skill
naming their plan and EZPoints first numbers, the loss on the move only."""

from __future__ import annotations

import json
import random
import re

import pytest
from safetensors.torch import load_file

from seed_vl.config import ConfigError, EnvConfig, ModelConfig, load_config
from seed_vl.envs.ezpoints import deal
from seed_vl.envs.registry import make_env
from seed_vl.policy import Policy
from seed_vl.skills import SKILL_HEADER
from seed_vl.toy import perception_pretraining
from seed_vl.toy.demonstrations import skill_turns, solver_plan
from seed_vl.toy.perception_pretraining import (
    CANDIDATES,
    final_push_turns,
    first_number_turns,
    move_accuracy,
    move_turns,
    perception_pretrained,
    train_perception,
)
from seed_vl.toy.warmstart import env_config, warmstart_examples

ENV = EnvConfig(name="sokoban_visual", cell_px=28)
EZPOINTS = EnvConfig(name="ezpoints_visual", image_size=168)


@pytest.fixture(scope="module")
def pushes(vl_policy):
    turns = final_push_turns(ENV, 6, seed=ENV.train_seed_start, image_settings=vl_policy.image_settings,
                             rng=random.Random(0))
    return move_turns(vl_policy, turns)


def test_a_final_push_is_a_first_turn_answered_by_the_move_that_solves_the_room(vl_policy, pushes):
    game, rng, seed = make_env(ENV), random.Random(0), ENV.train_seed_start
    for push in pushes:
        while (plan := solver_plan(game, seed, rng)) is None or len(plan) > game.max_steps:
            seed += 1  # the demonstrations skip tasks their solver cannot finish within the budget
        seed += 1
        images = [part for m in push.context if isinstance(m["content"], list) for part in m["content"]
                  if part["type"] == "image"]
        text = str(push.context)
        assert len(images) == 1 and "Previous turns" not in text and "Current observation (step" in text
        tokenizer = vl_policy.tokenizer
        assert tokenizer.decode(push.response_ids[: push.move_index]).endswith("</think><action>")
        assert tokenizer.decode(push.response_ids[push.move_index]) == plan[-1]  # the plan's last, winning move
        state = game.state
        for move in plan:
            state = state.move(move)[0]
        assert state.solved


def test_training_on_the_move_alone_learns_it(tiny_vl_path, pushes):
    """A handful of pushes, trained and measured on themselves: the move-token loss learns their moves."""
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    assert len({p.response_ids[p.move_index] for p in pushes}) > 1  # not one move for all
    curves = train_perception(policy, pushes, {"final_push": pushes}, 40, seed=0, batch_size=6, every=40,
                              show_progress=False)
    assert len(curves["final_push"]) == 2 and curves["final_push"][-1] == 1.0 == move_accuracy(policy, pushes)


def test_a_first_number_is_an_ezpoints_first_turn_answered_by_the_smaller_cards_value(vl_policy):
    examples = first_number_turns(EZPOINTS, 8, seed=EZPOINTS.train_seed_start,
                                  image_settings=vl_policy.image_settings, rng=random.Random(0))
    turns = move_turns(vl_policy, examples)
    answers = []
    for k, turn in enumerate(turns):
        cards = deal(random.Random(EZPOINTS.train_seed_start + k), "uniform_pair")  # dealt alike, whatever the recipe
        images = [part for m in turn.context if isinstance(m["content"], list) for part in m["content"]
                  if part["type"] == "image"]
        assert len(images) == 1 and "Previous turns" not in str(turn.context) and "(step 1)" in str(turn.context)
        answers.append(vl_policy.tokenizer.decode(turn.response_ids[turn.move_index]))
        assert answers[-1] == str(min(c.value for c in cards))[0]  # the first token: '1' for a 10
        assert answers[-1] in CANDIDATES["first_number"]
    assert len(set(answers)) > 1


def test_training_on_first_numbers_alone_learns_them(tiny_vl_path, vl_policy):
    turns = move_turns(vl_policy, first_number_turns(EZPOINTS, 6, seed=EZPOINTS.train_seed_start,
                                                     image_settings=vl_policy.image_settings, rng=random.Random(0)))
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    curves = train_perception(policy, turns, {"first_number": turns}, 100, seed=0, batch_size=6, every=100,
                              show_progress=False)
    assert curves["first_number"][-1] == 1.0 == move_accuracy(policy, turns, candidates=CANDIDATES["first_number"])


def test_a_skill_turn_shows_the_skill_whose_route_names_its_move(vl_policy):
    """Every turn of a varied plan (another order, a detour) carries the skill that names that plan: the move
    the answer makes is the one the skill's route gives for the turn's step number."""
    examples = skill_turns(ENV, 12, seed=ENV.train_seed_start, history_window=2,
                           image_settings=vl_policy.image_settings, rng=random.Random(0))
    turns = move_turns(vl_policy, examples)
    assert len(turns) == 12 and any("Previous turns" in str(t.context) for t in turns)  # the policy's history
    for turn in turns:
        text = " ".join(part["text"] for m in turn.context for part in
                        (m["content"] if isinstance(m["content"], list) else [{"type": "text", "text": m["content"]}])
                        if part["type"] == "text")
        step = re.findall(r"Current observation \(step (\d+)\)", text)[-1]
        move = vl_policy.tokenizer.decode(turn.response_ids[turn.move_index])
        assert SKILL_HEADER in text and f"step {step} {move}" in text


def test_perception_pretraining_is_cached_and_leaves_the_vision_tower_alone(tiny_vl_path, tmp_path, monkeypatch):
    start = tmp_path / "tiny-vl"
    Policy.from_pretrained(tiny_vl_path, device="cpu").save_pretrained(start)
    model = ModelConfig(path=str(start), device="cpu", freeze_vision_tower=False)  # frozen all the same
    out = perception_pretrained(start, 2, 4, model, ENV, seed=0, skill_turns=4, history_window=2,
                                show_progress=False)
    assert out == tmp_path / "tiny-vl-perception"
    summary = (out / perception_pretraining.SUMMARY_FILE).read_text()
    assert '"steps": 2' in summary and '"states": 4' in summary and '"skill_turns": 4' in summary
    assert set(json.loads(summary)["move_accuracy"]) == {"final_push", "skill_turn"}
    before, after = load_file(start / "model.safetensors"), load_file(out / "model.safetensors")
    assert all((before[k] == after[k]).all() for k in before if "visual" in k)
    assert any(not (before[k] == after[k]).all() for k in before if "self_attn" in k)  # attention learns

    monkeypatch.setattr(perception_pretraining, "train_perception", lambda *a, **k: pytest.fail("retrained"))
    assert perception_pretrained(start, 2, 4, model, ENV, seed=0, skill_turns=4, history_window=2,
                                 show_progress=False) == out
    monkeypatch.undo()
    with pytest.raises(ValueError, match="first_numbers: pass the EZPoints environment"):
        perception_pretrained(start, 2, 4, model, ENV, seed=0, first_numbers=4, show_progress=False)
    monkeypatch.undo()
    cards = perception_pretrained(start, 2, 4, model, ENV, seed=0, first_numbers=4, ezpoints=EZPOINTS,
                                  show_progress=False)
    assert set(json.loads((cards / perception_pretraining.SUMMARY_FILE).read_text())["move_accuracy"]) == {
        "final_push", "first_number"}
    other_frames = ENV.model_copy(update={"cell_px": 14})  # other training data: another key
    perception_pretrained(start, 2, 4, model, other_frames, seed=0, skill_turns=4, history_window=2,
                          show_progress=False)
    assert (out / perception_pretraining.SUMMARY_FILE).read_text() != summary


@pytest.mark.parametrize("field", ["perception_steps", "perception_skill_turns", "skill_drills"])
def test_perception_pretraining_needs_visual_sokoban(field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, ["warmstart.envs=[ezpoints_visual]", f"warmstart.{field}=10"])


@pytest.mark.parametrize("overrides", [
    ["warmstart.envs=[sokoban_visual]", "warmstart.perception_steps=10", "warmstart.perception_first_numbers=10"],
    ["warmstart.envs=[sokoban_visual]", "warmstart.first_number_drills=10"],
    ["warmstart.envs=[sokoban_visual, ezpoints_visual]", "warmstart.perception_first_numbers=10"],
])
def test_first_numbers_need_visual_ezpoints_and_the_perception_stage(overrides):
    with pytest.raises(ConfigError, match=r"perception_first_numbers|first_number_drills"):
        load_config(None, overrides)


def test_drills_add_final_pushes_and_skill_turns_to_the_sft(tmp_path):
    overrides = [f"warmstart.base_model={tmp_path / 'base'}", "warmstart.envs=[sokoban_visual]",
                 "warmstart.demonstrations=1", "warmstart.analyzer_episodes=0", "env.cell_px=28"]
    plain = load_config(None, overrides)
    drilled = load_config(None, [*overrides, "warmstart.perception_drills=3"])
    env = env_config(plain, "sokoban_visual")
    before = warmstart_examples(plain, [env], None)[0]
    after = warmstart_examples(drilled, [env], None)[0]
    assert after[: len(before)] == before and len(after) == len(before) + 3
    for drill in after[len(before):]:
        assert "Previous turns" not in str(drill.context) and drill.response.endswith("</action>")
        assert drill.response.startswith(("<think>This push puts the box", "<think>One push finishes"))
    read = warmstart_examples(load_config(None, [*overrides, "warmstart.skill_drills=4"]), [env], None)[0]
    assert read[: len(before)] == before and len(read) == len(before) + 4
    assert all(SKILL_HEADER in str(drill.context) for drill in read[len(before):])
    both = [*overrides, "warmstart.envs=[sokoban_visual, ezpoints_visual]", "env.image_size=168"]
    envs = [env_config(load_config(None, both), name) for name in ("sokoban_visual", "ezpoints_visual")]
    plain = warmstart_examples(load_config(None, both), envs, None)[0]
    cards = warmstart_examples(load_config(None, [*both, "warmstart.first_number_drills=3"]), envs, None)[0]
    assert cards[: len(plain)] == plain and len(cards) == len(plain) + 3
    assert all("EZPoints" in str(d.context) and "Previous turns" not in str(d.context) for d in cards[len(plain):])
