"""The perception probe: held-out one-move tasks, scored on whether the first answer wins."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pytest

from seed_vl.config import EnvConfig, load_config
from seed_vl.envs import ezpoints, sokoban
from seed_vl.policy import Generation
from seed_vl.rollout import play_episodes
from seed_vl.toy import perception_probe
from seed_vl.toy.perception_probe import measure_perception, one_action_tasks


def test_one_action_tasks_are_held_out_and_won_by_a_single_move():
    env = EnvConfig(name="sokoban_text")
    seeds = one_action_tasks(env, 6)
    assert len(seeds) == 6 and seeds == sorted(set(seeds)) and min(seeds) >= env.eval_seed_start
    assert all(len(sokoban.solve(sokoban.generate_room(seed))) == 1 for seed in seeds)
    assert one_action_tasks(EnvConfig(name="ezpoints_text"), 4) == []  # a formula is never one action


def _scripted(monkeypatch, choose):
    """Replace the policy's rollouts by an actor that answers `choose(seed)` on the same real episodes."""

    def rollouts(policy, group, sampling, *, seed, step):
        def act(prompts):
            return [
                Generation(f"<think>I push</think><action>{choose(group.seeds[p.episode])}</action>", [])
                for p in prompts
            ]

        return play_episodes(group, act, history_window=sampling.history_window, image_settings=None)

    monkeypatch.setattr(perception_probe, "collect_rollouts", rollouts)


@pytest.mark.parametrize("actor", ["sighted", "blind"])
def test_a_sighted_actor_solves_every_one_move_task_and_a_blind_one_only_its_move(monkeypatch, actor):
    config = load_config(None, ["env.name=sokoban_text", "logging.progress=false"])
    seeds = one_action_tasks(config.env, 12)
    winning = {seed: sokoban.solve(sokoban.generate_room(seed))[0] for seed in seeds}
    _scripted(monkeypatch, winning.get if actor == "sighted" else lambda seed: "up")

    measured = measure_perception(None, config, config.env, num_tasks=12)

    moves = Counter(winning.values())
    if actor == "sighted":
        assert measured == {"one_action/solved": 1.0, "one_action/top_move": moves.most_common(1)[0][1] / 12}
    else:  # always 'up': it wins exactly the tasks whose winning move is up, however the room looks
        assert measured == {"one_action/solved": moves["up"] / 12, "one_action/top_move": 1.0}
        assert measured["one_action/solved"] < 1.0


@pytest.mark.parametrize("reader", ["sighted", "blind"])
def test_ezpoints_first_numbers_tell_a_policy_that_reads_the_cards_from_a_blind_one(monkeypatch, vl_policy, reader):
    config = load_config(None, ["env.name=ezpoints_visual", "logging.progress=false"])
    seeds = range(config.env.eval_seed_start, config.env.eval_seed_start + 28)
    smaller = [min(card.value for card in ezpoints.deal(random.Random(seed), "uniform_pair")) for seed in seeds]
    token = vl_policy.tokenizer.convert_tokens_to_ids
    # A sighted policy ranks each held-out deal's smaller card first; a blind one always '2'.
    answers = [token(str(value)) for value in smaller] if reader == "sighted" else [token("2")] * len(smaller)
    monkeypatch.setattr(perception_probe, "top_moves", lambda policy, turns, candidates: answers[: len(turns)])

    measured = measure_perception(vl_policy, config, config.env, num_tasks=28)

    if reader == "sighted":
        assert measured["first_number/solver"] == 1.0
        assert measured["first_number/top_answer"] == Counter(smaller).most_common(1)[0][1] / 28 < 0.5
    else:  # right exactly on the deals whose smaller card is a 2, whatever the cards show
        assert measured == {"first_number/solver": smaller.count(2) / 28, "first_number/top_answer": 1.0}
        assert 0.0 < measured["first_number/solver"] < 0.5


RECIPE = str(Path(__file__).parents[1] / "configs" / "tiny" / "sokoban_visual.yaml")


def test_probe_script_measures_trains_and_rejects_bad_arguments(tiny_vl_path, tmp_path, capsys, script_module):
    probe = script_module("perception_probe")
    small = ["--model", tiny_vl_path, "--tasks", "2", "--random-tasks", "8", "--config", RECIPE]
    assert probe.main([*small, "--steps", "2", "--every", "1", "--batch", "2", "--demonstrations", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"a uniformly random policy wins \d of the first 8 held-out tasks; \d of them", out)
    assert [int(step) for step in re.findall(r"step +(\d+)  first move wins", out)] == [0, 1, 2]
    with pytest.raises(SystemExit) as exit_info:
        probe.main([*small, "--random-tasks", "0"])
    assert exit_info.value.code == 2 and "--random-tasks: must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        probe.main([*small, "rollout.history_window=-1"])
    assert exit_info.value.code == 2 and "history_window" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        probe.main(["--model", str(tmp_path / "missing")])
    assert exit_info.value.code == 2 and "--model: no model at" in capsys.readouterr().err


def test_probe_script_measures_ezpoints_first_numbers(tiny_vl_path, capsys, script_module):
    probe = script_module("perception_probe")
    ezpoints_recipe = RECIPE.replace("sokoban_visual", "ezpoints_visual")
    assert probe.main(["--model", tiny_vl_path, "--config", ezpoints_recipe, "--steps", "0", "--tasks", "3",
                       "--random-tasks", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"step +0  first number as the solver's [01]\.\d{3} \(one answer for every deal: 0\.286\)  "
                     r"most frequent first number (0\.333|0\.667|1\.000)", out)
