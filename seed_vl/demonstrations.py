"""Solver demonstrations: optimal episodes played through the same contexts the RL rollout builds.

Each turn's context comes from `build_messages` (history window included) and its response is a short
templated `<think>...</think><action>MOVE</action>`, parsed back with `parse_action` before the environment
steps, so a demonstration is exactly an episode the policy could have produced, and a won one. Solvers:
Sokoban's BFS, EZPoints' exhaustive search, TextWorld's walkthrough. Each episode carries its scripted
hindsight skill, for training contexts that show it.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs import ezpoints, sokoban
from seed_vl.envs.base import Env, phrase
from seed_vl.envs.registry import make_env
from seed_vl.processors.images import ImageSettings
from seed_vl.processors.messages import HistoryTurn, build_messages
from seed_vl.processors.parsing import parse_action
from seed_vl.trajectory import Trajectory, Turn

# Tasks whose solution exceeds the step budget are skipped; give up when fewer than 1 in 10 fit.
MAX_TASKS_PER_EPISODE = 10

Plan = list[str]
Planner = Callable[[Env, random.Random], Plan | None]  # an optimal plan from the state just reset to
Thinker = Callable[[Env, Plan, int, random.Random], str]  # the think text for move k of the plan


def play_demonstrations(
    env_config: EnvConfig,
    num_episodes: int,
    *,
    seed: int,
    history_window: int,
    image_settings: ImageSettings | None,
    rng: random.Random,
) -> list[Trajectory]:
    """`num_episodes` won episodes on the training seeds `seed, seed + 1, ...`, skipping any task whose
    solution does not fit the step budget; `rng` draws every choice (phrasings, formulas)."""
    env = make_env(env_config)
    planner, thinker = _solver_for(env)
    episodes: list[Trajectory] = []
    task_seed = seed
    while len(episodes) < num_episodes:
        if task_seed >= env_config.eval_seed_start:
            raise ConfigError(
                f"env.eval_seed_start: demonstration seed {task_seed} reaches the evaluation range; "
                "raise env.eval_seed_start"
            )
        if task_seed - seed >= MAX_TASKS_PER_EPISODE * (len(episodes) + 1):
            raise ConfigError(
                f"env.max_steps: the {env.name} solver finishes too few tasks within {env.max_steps} steps "
                f"({len(episodes)} of the first {task_seed - seed}); raise env.max_steps"
            )
        episode = _play(env, task_seed, planner, thinker, history_window, image_settings, rng)
        if episode is not None:
            episodes.append(episode)
        task_seed += 1
    return episodes


def _play(
    env: Env,
    seed: int,
    planner: Planner,
    thinker: Thinker,
    history_window: int,
    image_settings: ImageSettings | None,
    rng: random.Random,
) -> Trajectory | None:
    """One solved episode with its scripted skill, or None when the plan does not fit the step budget."""
    obs, info = env.reset(seed)
    plan = planner(env, rng)
    if plan is None or len(plan) > env.max_steps:
        return None
    episode = Trajectory(env_name=env.name, seed=seed, task=info["task"], group_id=0)
    history: list[HistoryTurn] = []
    for k, move in enumerate(plan):
        context = build_messages(env.name, obs, info, history, history_window, image_settings)
        response = f"<think>{thinker(env, plan, k, rng)}</think><action>{move}</action>"
        action, parsed = parse_action(response, info["admissible_actions"])
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        valid = parsed and bool(next_info["action_valid"])
        episode.turns.append(
            Turn(
                context=context,
                response_text=response,
                response_ids=[],
                action=action,
                action_valid=valid,
                reward=float(reward),
                observation_text=obs["text"],
                images=list(obs["images"]),
            )
        )
        history.append(
            HistoryTurn(observation=obs, response=response, action=action, valid=valid, reward=reward)
        )
        obs, info = next_obs, next_info
        if terminated or truncated:
            break
    episode.won = bool(info["won"])
    if not episode.won:  # a solver plan that does not win is a bug in the solver or the game
        raise RuntimeError(f"{env.name}: the solver's plan {plan} did not win seed {seed}")
    episode.episode_return = sum(turn.reward for turn in episode.turns)
    hindsight = env.hindsight(seed, episode.actions, rng)
    episode.summary, episode.skill = hindsight["episode_summary"], hindsight["episode_skill"]
    episode.analyzer_status = "ok"
    return episode


def _solver_for(env: Env) -> tuple[Planner, Thinker]:
    if isinstance(env, sokoban.SokobanEnv):
        return _sokoban_plan, _sokoban_think
    if isinstance(env, ezpoints.EZPointsEnv):
        return _ezpoints_plan, _ezpoints_think
    if env.name == "textworld":  # an optional extra: its module is not imported here
        return _walkthrough_plan, _walkthrough_think
    raise ConfigError(f"env.name: '{env.name}' has no solver for demonstrations")


# ------------------------------------------------------------------------------------------------ Sokoban
_SITUATION = (
    "The box is {box} from me and its target is {target} from the box.",
    "Box: {box} from me. Target: {target} from the box.",
    "I see the box {box} from me; the target lies {target} from it.",
)
_WALK = (
    "I walk {move} to get behind the box.",
    "Moving {move} brings me to the pushing side.",
    "First I step {move}.",
)
_PUSH = ("I push the box {move}.", "Pushing {move} moves the box toward the target.")
_FINAL_PUSH = ("Pushing {move} puts the box on the target.", "One push {move} finishes the room.")


def _sokoban_plan(env: sokoban.SokobanEnv, rng: random.Random) -> Plan | None:
    return sokoban.solve(env.state)


def _sokoban_think(env: sokoban.SokobanEnv, plan: Plan, k: int, rng: random.Random) -> str:
    """Where the box and its target are, then whether this move walks, pushes or finishes."""
    state, move = env.state, plan[k]
    after, _, pushed = state.move(move)
    if pushed:
        dr, dc = sokoban.DELTAS[move]
        box = (state.player[0] + dr, state.player[1] + dc)
    else:
        box = min(state.boxes - state.targets or state.boxes, key=lambda b: _distance(b, state.player))
    target = min(state.targets - state.boxes or state.targets, key=lambda t: _distance(t, box))
    situation = phrase(rng, _SITUATION, box=_offset(state.player, box), target=_offset(box, target))
    action = _FINAL_PUSH if after.solved else _PUSH if pushed else _WALK
    return f"{situation} {phrase(rng, action, move=move)}"


def _distance(a: sokoban.Cell, b: sokoban.Cell) -> int:
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def _offset(origin: sokoban.Cell, cell: sokoban.Cell) -> str:
    """'2 up and 1 left' (grid steps from `origin` to `cell`)."""
    dr, dc = cell[0] - origin[0], cell[1] - origin[1]
    parts = [f"{abs(dr)} {'down' if dr > 0 else 'up'}"] if dr else []
    parts += [f"{abs(dc)} {'right' if dc > 0 else 'left'}"] if dc else []
    return " and ".join(parts) or "0 away"


# ----------------------------------------------------------------------------------------------- EZPoints
_FIRST = (
    "The cards are worth {a} and {b}, and {formula} = 12, so I start with {token}.",
    "Values {a} and {b}: {formula} makes 12. First token: {token}.",
)
_OPERATOR = (
    "Next the operator {token}, since {formula} = 12.",
    "{formula} = 12, so the operator is {token}.",
)
_SECOND = ("Then {token} completes {formula}.", "The last number is {token}: {formula} = 12.")
_SUBMIT = ("{formula} equals 12 and uses both cards, so I submit.", "The formula {formula} is 12; submit it.")


def _ezpoints_plan(env: ezpoints.EZPointsEnv, rng: random.Random) -> Plan:
    return [*rng.choice(ezpoints.solve(env.values)), ezpoints.EQUALS]


def _ezpoints_think(env: ezpoints.EZPointsEnv, plan: Plan, k: int, rng: random.Random) -> str:
    token = plan[k]
    if token == ezpoints.EQUALS:
        templates = _SUBMIT
    elif token in ezpoints.OPERATORS:
        templates = _OPERATOR
    else:
        templates = _FIRST if k == 0 else _SECOND
    a, b = env.values
    return phrase(rng, templates, a=a, b=b, formula=" ".join(plan[:-1]), token=token)


# ---------------------------------------------------------------------------------------------- TextWorld
_NEXT_COMMAND = (
    "The objective needs '{command}' next.",
    "Following the objective, I {command} now.",
    "Step {n} of {total} toward the goal: {command}.",
)


def _walkthrough_plan(env: Env, rng: random.Random) -> Plan:
    return list(env.walkthrough)


def _walkthrough_think(env: Env, plan: Plan, k: int, rng: random.Random) -> str:
    return phrase(rng, _NEXT_COMMAND, command=plan[k], n=k + 1, total=len(plan))
