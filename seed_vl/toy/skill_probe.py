"""Does the policy read a skill? The precondition SEED's distillation channel rests on, measured.

On held-out tasks the policy plays three times: with no skill in its context (as deployed), with the correct
skill (the scripted analyzer's hindsight of the solver's winning episode on that very task, the kind of skill
a won group member hands its group), and with a wrong one (the correct skill of another task). On the
no-skill episodes, every move token (inside `<action>`) is then scored with and without the episode's own
scripted hindsight skill (what SEED's teacher sees with the scripted analyzer): the teacher-student gap
`l_skill - l_old` and the gate `sigmoid(beta * gap)` SEED would apply, averaged over won and over lost
episodes. Both are scored as the trainer scores, at the rollout temperature: at the evaluation's 0.4 the
student's own sampled moves sit near log-prob 0, so the gap can hardly be positive. A policy that reads
skills wins more with the correct one, not with the wrong one, and its gap is positive on won episodes,
whose skill names the moves they took. The same gap and gate are also measured on the correct-skill
episodes, each scored with and without the skill it was played with (`gap_correct/*`): how much a correct
skill raises the moves it led to, which is what the issue's precondition table reads "on the same
trajectories" as.
"""

from __future__ import annotations

import math
import random
import statistics

import torch

from seed_vl.config import Config, EnvConfig
from seed_vl.envs.base import Env
from seed_vl.envs.group import EnvGroup
from seed_vl.envs.registry import make_env
from seed_vl.evaluation import EVAL_STEP
from seed_vl.losses import opd_gate
from seed_vl.policy import Policy
from seed_vl.report import move_token_mask
from seed_vl.rollout import SamplingSettings, derive_seed, play_episodes, policy_actor
from seed_vl.skills import insert_skill
from seed_vl.toy.demonstrations import solver_plan
from seed_vl.trajectory import Trajectory

_PROBE_STREAM = 0x5C11


def measure_skill_following(policy: Policy, config: Config, env: EnvConfig, num_tasks: int) -> dict[str, float]:
    """Success per skill condition, and the move-token gap and gate for won and lost no-skill episodes."""
    sampling = SamplingSettings.from_config(config.rollout, temperature=config.eval.temperature)
    seeds = EnvGroup(env, num_tasks=num_tasks, group_size=1, split="eval").seeds
    skills = correct_skills(env, seeds)
    wrong = {seed: skills[seeds[(k + 1) % len(seeds)]] for k, seed in enumerate(seeds)}
    metrics, played = {}, {}
    for condition, skill_of in {"none": {}, "correct": skills, "wrong": wrong}.items():
        episodes = play_with_skills(policy, env, seeds, skill_of, sampling, seed=config.warmstart.seed)
        metrics[f"success/{condition}"] = statistics.fmean(e.won for e in episodes)
        played[condition] = episodes
    # No-skill episodes with their own hindsight skill (SEED's case); correct-skill ones with theirs.
    own = hindsight_skills(env, played["none"], seed=config.warmstart.seed)
    shown = {"": ("none", {e.seed: skill for e, skill in zip(played["none"], own, strict=True)}),
             "_correct": ("correct", skills)}
    for outcome in ("won", "lost"):
        for suffix, (condition, skill_of) in shown.items():
            episodes = [e for e in played[condition] if e.won == (outcome == "won")]
            gaps = torch.tensor(move_token_gaps(
                policy, episodes, [skill_of[e.seed] for e in episodes], temperature=config.rollout.temperature,
            ))
            gates = opd_gate(torch.zeros_like(gaps), gaps, config.algorithm.gate_beta)
            metrics[f"gap{suffix}/{outcome}"] = gaps.mean().item() if len(gaps) else math.nan
            metrics[f"gate{suffix}/{outcome}"] = gates.mean().item() if len(gaps) else math.nan
            metrics[f"move_tokens{suffix}/{outcome}"] = len(gaps)
    return metrics


def correct_skills(env: EnvConfig, seeds: list[int]) -> dict[int, str]:
    """Each task's scripted hindsight skill of the solver's winning episode on it."""
    game, skills = make_env(env), {}
    for seed in seeds:
        rng = random.Random(derive_seed(_PROBE_STREAM, seed))
        skills[seed] = game.hindsight(seed, solver_plan(game, seed, rng) or [], rng)["episode_skill"]
    return skills


def hindsight_skills(env: EnvConfig, episodes: list[Trajectory], *, seed: int) -> list[str]:
    """Each episode's scripted hindsight skill of its own actions."""
    game = make_env(env)
    return [
        game.hindsight(e.seed, e.actions, random.Random(derive_seed(seed, _PROBE_STREAM, e.seed)))["episode_skill"]
        for e in episodes
    ]


def play_with_skills(
    policy: Policy,
    env: EnvConfig,
    seeds: list[int],
    skill_of: dict[int, str],
    sampling: SamplingSettings,
    *,
    seed: int,
) -> list[Trajectory]:
    """One episode per task seed, each turn's context carrying that task's skill when it has one."""
    group = EnvGroup.of_seeds(env, seeds)
    actor = policy_actor(
        policy,
        sampling,
        seed_of=lambda p: derive_seed(seed, EVAL_STEP, group.seeds[p.episode], p.turn),
        context_of=lambda p: _with_skill(p.context, skill_of.get(group.seeds[p.episode])),
    )
    return play_episodes(
        group, actor, history_window=sampling.history_window, image_settings=policy.image_settings
    )


@torch.no_grad()
def move_token_gaps(
    policy: Policy, episodes: list[Trajectory], skills: list[str], temperature: float
) -> list[float]:
    """`l_skill - l_old` of every move token (inside `<action>`) the policy sampled in `episodes`, each
    scored with and without its episode's skill."""
    turns = [(turn, skill) for e, skill in zip(episodes, skills, strict=True) for turn in e.turns if turn.response_ids]
    if not turns:
        return []
    responses = [turn.response_ids for turn, _ in turns]
    contexts = [turn.context for turn, _ in turns] + [insert_skill(turn.context, skill) for turn, skill in turns]
    scored = policy.score(contexts, responses + responses, return_entropy=False, temperature=temperature).logprobs
    gaps = []
    for k, (turn, _) in enumerate(turns):
        moves = move_token_mask([policy.tokenizer.decode([t]) for t in turn.response_ids])
        gaps += (scored[len(turns) + k] - scored[k])[torch.tensor(moves)].tolist()
    return gaps


def _with_skill(context, skill: str | None):
    return context if skill is None else insert_skill(context, skill)


def skill_agrees(game: Env, seed: int, actions: list[str | None], skill: str | None) -> bool:
    """Whether `skill` states what the scripted analyzer's would for this episode (`Env.hindsight_facts`)."""
    return skill is not None and any(fact in skill for fact in game.hindsight_facts(seed, actions))


def analyzer_agreement(env: EnvConfig, trajectories: list[Trajectory]) -> dict[str, float]:
    """Of the analyzed `trajectories`, the share with a usable skill (`valid`) and the share whose skill
    states what the scripted analyzer's would (`agree`: the winning order or a correct solution, see
    `Env.hindsight_facts`), also over won episodes alone (`agree_won`; nan without any); and the share of
    lost episodes with a usable skill (`valid_lost`; nan without any), where the tiny model's invalid ones sit."""
    game = make_env(env)
    agrees = [skill_agrees(game, t.seed, t.actions, t.skill) for t in trajectories]
    won = [agree for agree, t in zip(agrees, trajectories, strict=True) if t.won]
    lost = [t.skill is not None for t in trajectories if not t.won]
    return {
        "valid": statistics.fmean(t.skill is not None for t in trajectories),
        "valid_lost": statistics.fmean(lost) if lost else math.nan,
        "agree": statistics.fmean(agrees),
        "agree_won": statistics.fmean(won) if won else math.nan,
    }
