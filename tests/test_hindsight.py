"""The scripted hindsight analyzer: trajectories played in the real environments, replayed from their seed;
the skill names what worked or the concrete mistake, in several phrasings."""

from __future__ import annotations

import json
import random
from collections import deque

import pytest

from seed_vl.config import EnvConfig
from seed_vl.envs.base import step_route
from seed_vl.envs.hindsight import scripted_hindsight
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import ACTIONS, is_deadlocked, solve
from seed_vl.trajectory import Trajectory, Turn


def played(env_config: EnvConfig, seed: int, actions: list[str | None]) -> Trajectory:
    """What a rollout records: play `actions` until the episode ends."""
    env = make_env(env_config)
    _, info = env.reset(seed)
    traj = Trajectory(env_name=env.name, seed=seed, task=info["task"], group_id=0)
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        traj.turns.append(Turn([], "", [], action, info["action_valid"], reward))
        if terminated or truncated:
            break
    traj.won = info["won"]
    traj.episode_return = sum(t.reward for t in traj.turns)
    return traj


def analyze(traj: Trajectory, env_config: EnvConfig, seed: int = 0) -> dict:
    result = scripted_hindsight(traj, random.Random(seed), env_config)
    assert set(result) == {"episode_summary", "episode_skill"} and json.loads(json.dumps(result)) == result
    assert len(result["episode_skill"].split()) >= 5
    return result


SOKOBAN = EnvConfig(name="sokoban_text")
EZPOINTS = EnvConfig(name="ezpoints_visual")


def start_state(seed: int):
    env = make_env(SOKOBAN)
    env.reset(seed)
    return env.state


def first_deadlocking_moves(seed: int) -> list[str]:
    """The shortest move list whose last move pushes a box into an unsolvable position."""
    start = start_state(seed)
    queue, seen = deque([(start, [])]), {start}
    while queue:
        state, moves = queue.popleft()
        for action in ACTIONS:
            nxt, moved, pushed = state.move(action)
            if pushed and is_deadlocked(nxt):
                return [*moves, action]
            if moved and nxt not in seen and not nxt.solved:
                seen.add(nxt)
                queue.append((nxt, [*moves, action]))
    raise AssertionError(f"seed {seed}: no deadlocking push")


def test_routes_are_quoted_step_by_step():
    """Each move under the step number its observation heading shows, so a skill can be followed."""
    assert step_route(["up", "left", "left"]) == "step 1 up, step 2 left, step 3 left"
    assert step_route([]) == ""


def test_a_route_keeps_each_move_under_its_turns_step_number():
    """A won episode with invalid answers at steps 2 and 3: the route leaves those turns out and numbers the
    later moves by their turns, as the policy's observation headings do."""
    plan = solve(start_state(2))
    traj = played(SOKOBAN, 2, [plan[0], None, "jump", *plan[1:]])
    route = step_route([plan[0], None, None, *plan[1:]])
    assert traj.won and route.startswith(f"step 1 {plan[0]}, step 4 {plan[1]}, step 5 ")
    assert route in analyze(traj, SOKOBAN)["episode_skill"]
    assert make_env(SOKOBAN).hindsight_facts(2, traj.actions) == [route]


def test_sokoban_success_gives_the_winning_route():
    plan = solve(start_state(4))
    traj = played(SOKOBAN, 4, plan)
    assert traj.won
    result = analyze(traj, SOKOBAN)
    assert step_route(plan) in result["episode_skill"]
    assert "Solved" in result["episode_summary"] and "optimal" in result["episode_summary"]


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_sokoban_failure_names_the_step_and_push_that_got_the_box_stuck(seed):
    moves = first_deadlocking_moves(seed)
    traj = played(SOKOBAN, seed, moves + ["up", "left", "down", "right"] * 4)
    assert not traj.won
    for rng_seed in range(3):
        skill = analyze(traj, SOKOBAN, rng_seed)["episode_skill"]
        assert f"step {len(moves)}" in skill and moves[-1] in skill
        assert "corner" in skill or "wall" in skill or "no target can be reached" in skill


def test_sokoban_failure_names_the_moves_wasted_against_walls():
    start = start_state(6)
    bump = next(a for a in ACTIONS if not start.move(a)[1])
    result = analyze(played(SOKOBAN, 6, [bump] * 15), SOKOBAN)
    assert "steps 1-15" in result["episode_skill"] and step_route(solve(start)) in result["episode_skill"]
    assert "15 moves ran into a wall" in result["episode_summary"]


def test_sokoban_failure_names_invalid_answers():
    result = analyze(played(SOKOBAN, 6, [None] * 15), SOKOBAN)
    assert "15 turns (steps 1-15)" in result["episode_skill"]


def ezpoints_seed(values: tuple[int, int]) -> int:
    env = make_env(EZPOINTS)
    return next(s for s in range(1000) if env.reset(s)[1]["card_values"] == list(values))


def test_ezpoints_success_gives_the_formula():
    result = analyze(played(EZPOINTS, ezpoints_seed((3, 4)), ["3", "*", "4", "="]), EZPOINTS)
    assert "3 * 4" in result["episode_skill"] and "won" in result["episode_summary"]


def test_ezpoints_failure_names_the_wrong_formula_and_a_correct_one():
    traj = played(EZPOINTS, ezpoints_seed((3, 4)), ["3", "+", "4", "="])
    for rng_seed in range(4):
        skill = analyze(traj, EZPOINTS, rng_seed)["episode_skill"]
        assert "'3 + 4'" in skill and "7" in skill and ("3 * 4" in skill or "4 * 3" in skill)


@pytest.mark.parametrize(
    ("actions", "max_steps", "expected"),
    [
        (["5", "3", "*", "4", None, None, None, None], None, "'5'"),  # a number that is not on the cards
        (["3", "="], None, "'3'"),  # submitted before using both cards
        (["4", "*", "3"], 3, "never submitted"),  # ran out of steps before '='
    ],
    ids=["invalid-token", "early", "unfinished"],
)
def test_ezpoints_failures_name_the_mistake(actions, max_steps, expected):
    cfg = EnvConfig(name="ezpoints_text", max_steps=max_steps)
    result = analyze(played(cfg, ezpoints_seed((3, 4)), actions), cfg)
    text = result["episode_summary"] + " " + result["episode_skill"]
    assert expected in text and ("3 * 4" in result["episode_skill"] or "4 * 3" in result["episode_skill"])


def test_phrasings_vary_with_the_rng_and_repeat_for_the_same_seed():
    traj = played(SOKOBAN, 0, first_deadlocking_moves(0) + [None] * 15)
    skills = [analyze(traj, SOKOBAN, s)["episode_skill"] for s in range(12)]
    assert len(set(skills)) >= 2
    assert analyze(traj, SOKOBAN, 5) == analyze(traj, SOKOBAN, 5)


def test_dispatcher_rejects_a_trajectory_of_another_environment():
    traj = played(EZPOINTS, 0, ["="])
    with pytest.raises(ValueError, match="ezpoints_visual"):
        scripted_hindsight(traj, random.Random(0), SOKOBAN)


def test_hindsight_facts_are_what_a_correct_skill_quotes():
    """Sokoban: the winning order when won, else the shortest solution; EZPoints: the winning formula, else
    every correct one. The scripted skill quotes one of them, in every phrasing."""
    sokoban = make_env(SOKOBAN)
    plan = solve(start_state(2))
    assert len(plan) == 8 and sokoban.hindsight_facts(2, plan) == [step_route(plan)]
    assert sokoban.hindsight_facts(2, plan[:-1]) == [step_route(plan)]  # one move short: lost, the solution
    ezpoints = make_env(EZPOINTS)
    seed = ezpoints_seed((3, 4))
    assert ezpoints.hindsight_facts(seed, ["3", "*", "4", "="]) == ["3 * 4"]
    assert ezpoints.hindsight_facts(seed, ["3", "+", "4", "="]) == ["3 * 4", "4 * 3"]
    for env, actions in [(SOKOBAN, plan), (SOKOBAN, plan[:-1]), (EZPOINTS, ["3", "+", "4", "="])]:
        seed_of = 2 if env is SOKOBAN else seed
        skill = analyze(played(env, seed_of, actions), env)["episode_skill"]
        assert any(fact in skill for fact in make_env(env).hindsight_facts(seed_of, actions))
