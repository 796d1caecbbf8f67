"""Grouped multi-turn rollouts (DESIGN §1 stage 2 step 1: the frozen current policy is the actor).

`play_episodes` is the one episode loop: every turn, all live episodes of all groups are answered by one
call of an actor (the policy's batched `generate` here; solver and random actors for the toy's
demonstrations). Each episode keeps its own history; the context shows the last K turns. Sampling seeds
derive from (seed, step, episode, turn), so a rollout depends only on the weights and those numbers: the
same on a resumed run.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from seed_vl.config import RolloutConfig
from seed_vl.envs.group import EnvGroup
from seed_vl.policy import Context, Generation, Policy
from seed_vl.processors.images import ImageSettings
from seed_vl.processors.messages import HistoryTurn, build_messages
from seed_vl.processors.parsing import parse_action
from seed_vl.trajectory import Trajectory, Turn
from seed_vl.vision_cache import image_key

STOP_STRINGS = ("</action>",)


@dataclass(frozen=True)
class SamplingSettings:
    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    history_window: int = 2

    @classmethod
    def from_config(cls, rollout: RolloutConfig, temperature: float | None = None) -> SamplingSettings:
        """The recipe's rollout sampling; `temperature` overrides it (evaluation samples at its own)."""
        t = rollout.temperature if temperature is None else temperature
        return cls(rollout.max_new_tokens, t, rollout.top_p, rollout.history_window)


@dataclass(frozen=True)
class Prompt:
    """What the actor sees at one turn of one live episode: the chat context and the env's info (task,
    admissible actions)."""

    episode: int  # index into the group
    turn: int
    context: Context
    info: dict[str, Any]


Actor = Callable[[list[Prompt]], list[Generation]]  # one response per prompt, in order


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions."""
    digest = hashlib.blake2b(",".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def collect_rollouts(
    policy: Policy,
    group: EnvGroup,
    sampling: SamplingSettings,
    *,
    seed: int,
    step: int,
    on_episode_end: Callable[[], None] | None = None,
) -> list[Trajectory]:
    """Play one episode in every environment of `group` with the policy as the actor: all live episodes
    of a turn are answered by one batched `generate` call."""
    actor = policy_actor(
        policy, sampling, seed_of=lambda p: derive_seed(seed, step, group.episode_ids[p.episode], p.turn)
    )
    return play_episodes(
        group, actor, history_window=sampling.history_window, image_settings=policy.image_settings,
        on_episode_end=on_episode_end,
    )


def policy_actor(
    policy: Policy,
    sampling: SamplingSettings,
    *,
    seed_of: Callable[[Prompt], int],
    context_of: Callable[[Prompt], Context] = lambda prompt: prompt.context,
) -> Actor:
    """The policy answering a turn's prompts in one batched `generate`, each sampled with its own seed;
    `context_of` may show it something else than the ordinary context (e.g. a skill inserted)."""

    def act(prompts: list[Prompt]) -> list[Generation]:
        return policy.generate(
            [context_of(p) for p in prompts],
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            stop_strings=STOP_STRINGS,
            seeds=[seed_of(p) for p in prompts],
        )

    return act


def play_episodes(
    group: EnvGroup,
    actor: Actor,
    *,
    history_window: int,
    image_settings: ImageSettings | None,
    on_episode_end: Callable[[], None] | None = None,
) -> list[Trajectory]:
    """The episode loop: one episode in every environment of `group`, turn by turn. Each episode keeps its
    own history; its context shows the last `history_window` turns; output that does not parse is an
    invalid action. Returns one Trajectory per environment."""
    env_name = group.env_name
    resets = group.reset()
    observations = [obs for obs, _ in resets]
    infos = [info for _, info in resets]
    trajectories = [
        Trajectory(
            env_name=env_name, seed=group.seeds[i], task=infos[i]["task"], group_id=group.group_ids[i],
            episode_id=group.episode_ids[i],
        )
        for i in range(len(resets))
    ]
    histories: list[list[HistoryTurn]] = [[] for _ in resets]
    live = list(range(len(resets)))
    turn = 0
    while live:
        prompts = [
            Prompt(
                episode=i,
                turn=turn,
                context=build_messages(
                    env_name, observations[i], infos[i], histories[i], history_window, image_settings
                ),
                info=infos[i],
            )
            for i in live
        ]
        generations = actor(prompts)
        actions = {
            i: parse_action(gen.text, infos[i].get("admissible_actions"))
            for i, gen in zip(live, generations, strict=True)
        }
        results = group.step({i: action for i, (action, _) in actions.items()})
        still_live = []
        for prompt, gen in zip(prompts, generations, strict=True):
            i = prompt.episode
            obs, reward, terminated, truncated, info = results[i]
            action, parsed_ok = actions[i]
            valid = bool(info.get("action_valid", parsed_ok))
            trajectories[i].turns.append(
                Turn(
                    context=prompt.context,
                    response_text=gen.text,
                    response_ids=list(gen.token_ids),
                    rollout_logprobs=None if gen.logprobs is None else list(gen.logprobs),
                    action=action,
                    action_valid=valid,
                    reward=float(reward),
                    observation_text=observations[i]["text"],
                    images=list(observations[i]["images"]),
                )
            )
            histories[i].append(
                HistoryTurn(
                    observation=observations[i], response=gen.text, action=action, valid=valid, reward=reward,
                    admissible_actions=infos[i]["admissible_actions"],
                )
            )
            observations[i], infos[i] = obs, info
            if terminated or truncated:
                trajectories[i].won = bool(info.get("won", False))
                if on_episode_end is not None:
                    on_episode_end()
            else:
                still_live.append(i)
        live = still_live
        turn += 1
    for traj in trajectories:
        traj.episode_return = sum(t.reward for t in traj.turns)
    return trajectories


def frame_id(image: Image.Image) -> str:
    """Content hash of a frame: the same pixels are stored (and encoded) once."""
    return image_key(image, settings="")[:20]


def save_trajectories(
    trajectories: list[Trajectory], out_dir: str | Path, name: str = "trajectories", tokenizer=None
) -> Path:
    """Write `name.jsonl` (one trajectory per line) and `frames/<frame_id>.png` (one file per unique frame).

    Image items become frame ids; with a tokenizer, each turn also records its response as token strings
    (`response_tokens`, aligned with `response_ids` and `gates`) for the trajectory report."""
    out_dir = Path(out_dir)
    frames_dir = out_dir / "frames"
    frames_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for traj in trajectories:
            record = traj.to_record(image_ref=lambda img: _store_frame(img, frames_dir))
            if tokenizer is not None:
                for turn in record["turns"]:
                    turn["response_tokens"] = [tokenizer.decode([t]) for t in turn["response_ids"]]
            f.write(json.dumps(record) + "\n")
    return path


def _store_frame(image: Image.Image, frames_dir: Path) -> str:
    fid = frame_id(image)
    target = frames_dir / f"{fid}.png"
    if not target.exists():
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        target.write_bytes(buf.getvalue())
    return fid
