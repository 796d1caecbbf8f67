"""Does the policy see its observation? The precondition any RL from this base rests on, measured.

Held-out tasks whose solver plan is a single action (a Sokoban room where one push wins) are played as the
evaluation plays them (no skill, its temperature and step budget): the share won on the first move is how
often the first answer is the one move the observation decides. Chance is one in the number of actions
(25% for Sokoban's four moves); a policy that reads the frame approaches 100%. The share of the most frequent first move tells a
fixed preference apart from sight: a policy that answers the same move whatever it sees is blind, and RL
would have to learn perception from the reward alone. EZPoints has no one-move task; its counterpart is the
first number of a deal with one solvable pair, which only the cards decide.
"""

from __future__ import annotations

import random
from collections import Counter

from seed_vl.config import Config, EnvConfig
from seed_vl.envs.ezpoints import SOLVABLE_PAIRS
from seed_vl.envs.group import EnvGroup
from seed_vl.envs.registry import make_env
from seed_vl.evaluation import EVAL_STEP
from seed_vl.policy import Policy
from seed_vl.rollout import SamplingSettings, collect_rollouts
from seed_vl.toy.demonstrations import solver_plan
from seed_vl.toy.perception_pretraining import CANDIDATES, first_number_turns, move_turns, top_moves

# The most a blind policy gets right on EZPoints' first numbers: one number (the commonest smaller card of
# the solvable pairs) for every deal.
BLIND_FIRST_NUMBER = Counter(min(pair) for pair in SOLVABLE_PAIRS).most_common(1)[0][1] / len(SOLVABLE_PAIRS)
SCAN_PER_TASK = 50  # give up when fewer than 1 in 50 seeds is a one-action task (EZPoints has none)


def one_action_tasks(env: EnvConfig, count: int) -> list[int]:
    """The first `count` held-out seeds whose solver plan is one action (fewer where they are rare)."""
    game, rng = make_env(env), random.Random(0)
    seeds, seed = [], env.eval_seed_start
    while len(seeds) < count and seed - env.eval_seed_start < SCAN_PER_TASK * (len(seeds) + 1):
        plan = solver_plan(game, seed, rng)
        if plan is not None and len(plan) == 1:
            seeds.append(seed)
        seed += 1
    return seeds


def measure_perception(policy: Policy, config: Config, env: EnvConfig, num_tasks: int) -> dict[str, float]:
    """`one_action/solved` and `one_action/top_move` (shares); EZPoints' `first_number/*` instead; empty when
    `env` has neither."""
    if env.name.startswith("ezpoints"):
        return measure_card_reading(policy, env, num_tasks, seed=config.warmstart.seed)
    seeds = one_action_tasks(env, num_tasks)
    if not seeds:
        return {}
    # The whole budget, not one move: a task that says "within 1 moves" is a prompt the policy never saw.
    group = EnvGroup.of_seeds(env, seeds)
    sampling = SamplingSettings.from_config(config.rollout, temperature=config.eval.temperature)
    episodes = collect_rollouts(policy, group, sampling, seed=config.warmstart.seed, step=EVAL_STEP)
    first_moves = Counter(episode.turns[0].action for episode in episodes)
    return {
        "one_action/solved": sum(episode.won and episode.length == 1 for episode in episodes) / len(episodes),
        "one_action/top_move": first_moves.most_common(1)[0][1] / len(episodes),
    }


def measure_card_reading(policy: Policy, env: EnvConfig, num_tasks: int, *, seed: int) -> dict[str, float]:
    """EZPoints' one-move tasks: the first turns of `num_tasks` held-out deals of a single solvable pair
    (`uniform_pair`), the cards and an empty formula. `first_number/solver`: the share whose first number
    the policy ranks first as the solver answers it (the smaller card); `first_number/top_answer`: the share
    of its most frequent first number (a blind policy gives one whatever the cards show)."""
    # Demonstrations refuse the evaluation seeds (no training on them): measured here, they are a split's
    # training seeds. Every `uniform_pair` deal is solvable, so they are the first `num_tasks` of them.
    held_out = env.model_copy(update={"train_seed_start": env.eval_seed_start,
                                      "eval_seed_start": env.eval_seed_start + num_tasks})
    examples = first_number_turns(
        held_out, num_tasks, seed=held_out.train_seed_start, image_settings=policy.image_settings,
        rng=random.Random(seed),
    )
    turns = move_turns(policy, examples)
    ranked = top_moves(policy, turns, candidates=CANDIDATES["first_number"])
    right = sum(number == turn.response_ids[turn.move_index] for number, turn in zip(ranked, turns, strict=True))
    return {
        "first_number/solver": right / len(turns),
        "first_number/top_answer": Counter(ranked).most_common(1)[0][1] / len(turns),
    }
