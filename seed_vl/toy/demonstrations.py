"""Solver demonstrations: optimal episodes played through the rollout's own episode loop.

A solver actor answers each turn of `rollout.play_episodes` with a short templated
`<think>...</think><action>MOVE</action>`, parsed like a model's answer before the environment steps, so a
demonstration is exactly an episode the policy could have produced, and a won one. Solvers:
Sokoban's BFS, EZPoints' exhaustive search, TextWorld's walkthrough. Each episode carries its scripted
hindsight skill, for training contexts that show it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs import ezpoints, sokoban
from seed_vl.envs.base import Env, phrase
from seed_vl.envs.group import EnvGroup
from seed_vl.envs.registry import make_env
from seed_vl.policy import Generation
from seed_vl.processors.images import ImageSettings
from seed_vl.rollout import Actor, Prompt, play_episodes
from seed_vl.sft import SFTExample
from seed_vl.skills import insert_skill
from seed_vl.trajectory import Trajectory

# Tasks whose solution exceeds the step budget are skipped; give up when fewer than 1 in 10 fit.
MAX_TASKS_PER_EPISODE = 10
BATCH = 32  # episodes played at once
_ANSWER = re.compile(r"<think>(?P<think>.*)</think>(?P<action><action>.*</action>)", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.;])\s+")

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
    varied: bool = False,
) -> list[Trajectory]:
    """`num_episodes` won episodes on the training seeds `seed, seed + 1, ...`, skipping any task whose
    solution does not fit the step budget, each with its scripted skill; `rng` draws every choice
    (phrasings, formulas). `varied`: each plan is drawn among many winning ones (another shortest order,
    a detour first) instead of the solver's canonical one, so that only its skill tells it apart."""
    env = make_env(env_config)
    planner, thinker = _solver_for(env, varied)
    plans: dict[int, Plan] = {}  # task seed -> the plan the solver plays
    task_seed = seed
    while len(plans) < num_episodes:
        if task_seed >= env_config.eval_seed_start:
            raise ConfigError(
                f"env.eval_seed_start: demonstration seed {task_seed} reaches the evaluation range; "
                "raise env.eval_seed_start"
            )
        if task_seed - seed >= MAX_TASKS_PER_EPISODE * (len(plans) + 1):
            raise ConfigError(
                f"env.max_steps: the {env.name} solver finishes too few tasks within {env.max_steps} steps "
                f"({len(plans)} of the first {task_seed - seed}); raise env.max_steps"
            )
        env.reset(task_seed)
        plan = planner(env, rng)
        if plan is not None and len(plan) <= env.max_steps:
            plans[task_seed] = plan
        task_seed += 1

    def solver(group: EnvGroup) -> Actor:
        def act(prompts: list[Prompt]) -> list[Generation]:
            responses = []
            for p in prompts:
                game, plan = group.envs[p.episode], plans[group.seeds[p.episode]]
                if p.turn < len(plan):
                    think = thinker(game, plan, p.turn, rng)
                    responses.append(f"<think>{think}</think><action>{plan[p.turn]}</action>")
                else:  # past the plan: an invalid answer (the episode then fails, and we raise)
                    responses.append("")
            return [Generation(text, []) for text in responses]

        return act

    episodes = _play_in_batches(env_config, list(plans), solver, history_window, image_settings)
    for episode in episodes:
        if not episode.won:  # a solver plan that does not win is a bug in the solver or the game
            plan = plans[episode.seed]
            raise RuntimeError(f"{env.name}: the solver's plan {plan} did not win seed {episode.seed}")
        hindsight = env.hindsight(episode.seed, episode.actions, rng)
        episode.summary, episode.skill = hindsight["episode_summary"], hindsight["episode_skill"]
        episode.analyzer_status = "ok"
    return episodes


def play_random_episodes(
    env_config: EnvConfig,
    seeds: list[int],
    *,
    history_window: int,
    image_settings: ImageSettings | None,
    rng: random.Random,
) -> list[Trajectory]:
    """One episode per seed of uniformly random admissible actions (mostly failures, for avoidance skills)."""

    def random_actor(group: EnvGroup) -> Actor:
        def act(prompts: list[Prompt]) -> list[Generation]:
            moves = [rng.choice(p.info["admissible_actions"]) for p in prompts]
            return [Generation(f"<think>I try {move}.</think><action>{move}</action>", []) for move in moves]

        return act

    return _play_in_batches(env_config, seeds, random_actor, history_window, image_settings)


def _play_in_batches(
    env_config: EnvConfig,
    seeds: list[int],
    actor_for: Callable[[EnvGroup], Actor],
    history_window: int,
    image_settings: ImageSettings | None,
) -> list[Trajectory]:
    """Episodes on `seeds`, `BATCH` at a time (each live episode holds a game: TextWorld's is a process)."""
    episodes = []
    for k in range(0, len(seeds), BATCH):
        group = EnvGroup.of_seeds(env_config, seeds[k : k + BATCH])
        episodes += play_episodes(group, actor_for(group), history_window=history_window, image_settings=image_settings)
    return episodes


def demonstration_examples(
    env_config: EnvConfig,
    num_episodes: int,
    *,
    seed: int,
    history_window: int,
    image_settings: ImageSettings | None,
    skill_fraction: float,
    rng: random.Random,
) -> list[SFTExample]:
    """One example per turn of `num_episodes` solver demonstrations. A `skill_fraction` share of the
    episodes plays a varied plan (another move order, a detour) with its scripted skill, which names that
    plan, in every context: there the frame alone does not decide the move, the skill does, which teaches
    reading it. The other episodes play the canonical plan with no skill, as a deployed policy acts."""
    with_skill = round(num_episodes * skill_fraction)
    kwargs = dict(history_window=history_window, image_settings=image_settings, rng=rng)
    plain = play_demonstrations(env_config, num_episodes - with_skill, seed=seed, **kwargs)
    next_seed = max((e.seed for e in plain), default=seed - 1) + 1
    varied = play_demonstrations(env_config, with_skill, seed=next_seed, varied=True, **kwargs)
    examples = [SFTExample(turn.context, turn.response_text) for episode in plain for turn in episode.turns]
    examples += [
        SFTExample(insert_skill(turn.context, episode.skill), turn.response_text)
        for episode in varied
        for turn in episode.turns
    ]
    return examples


def skill_turns(
    env_config: EnvConfig,
    count: int,
    *,
    seed: int,
    history_window: int,
    image_settings: ImageSettings | None,
    rng: random.Random,
) -> list[SFTExample]:
    """`count` turns of varied demonstrations (another move order, a detour first) on the training seeds from
    `seed`, each shown as the policy sees it with the scripted skill that names the plan, answers terse: the
    frame does not decide these moves, the skill does."""
    turns: list[SFTExample] = []
    while len(turns) < count:
        episodes = play_demonstrations(
            env_config, BATCH, seed=seed, history_window=history_window, image_settings=image_settings, rng=rng,
            varied=True,
        )
        turns += [
            SFTExample(terse_answers(insert_skill(turn.context, e.skill)), terse_response(turn.response_text))
            for e in episodes
            for turn in e.turns
        ]
        seed = episodes[-1].seed + 1
    return turns[:count]


def terse_response(response: str) -> str:
    """A solver demonstration's answer with only the last sentence of its think text ("I push the box at
    step 3"): the situation sentence before it would triple every response of the tiny model, the cost of
    every rollout turn and the tokens it must learn."""
    match = _ANSWER.fullmatch(response)
    if match is None:
        return response
    last = _SENTENCE_END.split(match["think"].strip())[-1]
    return f"<think>{last}</think>{match['action']}"


def terse_answers(context: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The context with its earlier answers (episode mode's assistant messages) made terse, as the policy
    learns to write them."""
    return [{**m, "content": terse_response(m["content"])} if m["role"] == "assistant" else m for m in context]


def solver_plan(env: Env, seed: int, rng: random.Random) -> Plan | None:
    """The solver's canonical plan for task `seed` (None: no solution)."""
    env.reset(seed)
    return _solver_for(env)[0](env, rng)


def _solver_for(env: Env, varied: bool = False) -> tuple[Planner, Thinker]:
    if isinstance(env, sokoban.SokobanEnv):
        return (_varied_sokoban_plan if varied else _sokoban_plan), _sokoban_think
    if isinstance(env, ezpoints.EZPointsEnv):
        return (_varied_ezpoints_plan if varied else _ezpoints_plan), _ezpoints_think
    if env.name == "textworld":  # an optional extra: its module is not imported here
        return _walkthrough_plan, _walkthrough_think
    raise ConfigError(f"env.name: '{env.name}' has no solver for demonstrations")


# ------------------------------------------------------------------------------------------------ Sokoban
_SITUATION = (
    "The box is {box} from me and its target is {target} from the box.",
    "Box: {box} from me. Target: {target} from the box.",
    "I see the box {box} from me; the target lies {target} from it.",
)
# The last sentence (the terse answer the warm start trains on) never names the move, so the move is decided
# in `<action>`, from the frame or from a skill in context; it ends on the step's number, two tokens before
# the move, as a skill's route puts each number two tokens before its move ("step 3 left").
_WALK = ("I walk to get behind the box at step {k}", "I move to the pushing side at step {k}")
_PUSH = ("I push the box at step {k}", "I push the box toward the target at step {k}")
_FINAL_PUSH = ("This push puts the box on the target at step {k}", "One push finishes the room at step {k}")


def _sokoban_plan(env: sokoban.SokobanEnv, rng: random.Random) -> Plan | None:
    return sokoban.solve(env.state)


def _varied_sokoban_plan(env: sokoban.SokobanEnv, rng: random.Random) -> Plan | None:
    """Mostly one to three random moves first (never into a dead end), then a shortest plan from there
    with the moves tried in a random order; otherwise only the random order."""
    state, detour = env.state, []
    if rng.random() < 0.75:
        for _ in range(rng.randint(1, 3)):
            moves = [m for m in sokoban.ACTIONS if state.move(m)[1] and not sokoban.is_deadlocked(state.move(m)[0])]
            move = rng.choice(moves)
            state, detour = state.move(move)[0], [*detour, move]
    order = list(sokoban.ACTIONS)
    rng.shuffle(order)
    rest = sokoban.solve(state, actions=order)
    return None if rest is None else detour + rest


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
    return f"{situation} {phrase(rng, action, k=k + 1)}"


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
    "The cards are worth {a} and {b}, and {formula} = 12. I enter the first number at step {k}",
    "Values {a} and {b}: {formula} makes 12. The first number at step {k}",
)
_OPERATOR = ("{formula} = 12. Next the operator at step {k}", "I type {formula}. The operator at step {k}")
_SECOND = ("{formula} = 12. The second number at step {k}", "I type {formula}. The last number at step {k}")
_SUBMIT = ("{formula} equals 12 and uses both cards. I submit at step {k}", "{formula} is 12. Submit at step {k}")


def _ezpoints_plan(env: ezpoints.EZPointsEnv, rng: random.Random) -> Plan:
    return [*ezpoints.solve(env.values)[0], ezpoints.EQUALS]


def _varied_ezpoints_plan(env: ezpoints.EZPointsEnv, rng: random.Random) -> Plan:
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
    return phrase(rng, templates, a=a, b=b, formula=" ".join(plan[:-1]), k=k + 1)


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
