"""Perception pretraining: the sight that a pretrained VL model brings and the tiny one lacks.

A policy that cannot tell on which side of it the box lies answers one move whatever it sees, and RL from
it would have to learn perception from the reward alone. The warm start's behaviour cloning does not teach
it: a move is one token in twenty-five of a demonstration's answer, the history frames and the previous
moves predict much of it without looking, and the recipe's SFT freezes the decoder's attention, the only
place where the relation of the player's cell to the box's cell can be learnt. `warmstart.perception_steps`
therefore first trains the barest decision a frame makes, in the policy's own prompt: a room one push from
solved (the last state of a solver demonstration), shown with no history, -> the winning move, the loss on
the move only; the vision tower stays frozen and lookup documents fill half of every batch so that the
lookup pretraining before it survives. `warmstart.perception_drills` mixes final pushes into the SFT as
chat examples, as lookup drills keep the lookup: without them the SFT unlearns sight even with attention
and tower frozen. A stand-in for pretraining, not part of SEED; visual Sokoban only.

Measured on the Sokoban recipe (one run): the held-out move accuracy stays near chance to 47% for 500
steps, then jumps to 100% by step 600 (1,000 steps: 17 minutes). After the SFT the base wins the first
move of all 96 held-out one-move tasks with 1,200 drills, 25% (chance) without them (README, "Perception
pretraining gives the base sight").

`perception_pretrained` caches its result beside the model it starts from, keyed by the settings, that
model (weights and config), this file and the training data itself; `perception.json` holds the held-out
move accuracy curve.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seed_vl.config import EnvConfig, ModelConfig
from seed_vl.envs.sokoban import ACTIONS
from seed_vl.io import atomic_directory, atomic_write_text, content_digest, model_digest
from seed_vl.policy import Policy
from seed_vl.processors.images import ImageSettings
from seed_vl.sft import SFTExample
from seed_vl.toy.demonstrations import play_demonstrations, terse_response
from seed_vl.toy.lookup_pretraining import lookup_batch
from seed_vl.tracking import Phase

BATCH_SIZE, LR, HELD_OUT = 16, 1e-3, 128
SUMMARY_FILE = "perception.json"


@dataclass(frozen=True)
class FinalPush:
    """A first-turn context showing a room one push from solved, its answer's token ids and the index of
    the move among them."""

    context: list[dict[str, Any]]
    response_ids: list[int]
    move_index: int


def final_push_turns(
    env: EnvConfig, count: int, *, seed: int, image_settings: ImageSettings | None, rng: random.Random
) -> list[SFTExample]:
    """The last turn of `count` solver demonstrations on the training seeds from `seed`, each shown as a
    first turn (no history), answered with the terse answer the warm start trains on."""
    episodes = play_demonstrations(env, count, seed=seed, history_window=0, image_settings=image_settings, rng=rng)
    return [SFTExample(e.turns[-1].context, terse_response(e.turns[-1].response_text)) for e in episodes]


def final_pushes(policy: Policy, env: EnvConfig, count: int, *, seed: int, rng: random.Random) -> list[FinalPush]:
    """`final_push_turns`, tokenized, with the index of the move in each answer."""
    encode = lambda text: policy.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    return [
        FinalPush(turn.context, encode(turn.response), len(encode(turn.response[: turn.response.index("</think>")]
                                                               + "</think><action>")))
        for turn in final_push_turns(env, count, seed=seed, image_settings=policy.image_settings, rng=rng)
    ]


def move_loss(policy: Policy, pushes: list[FinalPush]) -> torch.Tensor:
    """The mean NLL of the pushes' moves (the answers up to the move: the think text carries no loss)."""
    logprobs = policy.score(
        [p.context for p in pushes],
        [p.response_ids[: p.move_index + 1] for p in pushes],
        micro_batch_size=len(pushes),
        with_grad=True,
        return_entropy=False,
    ).logprobs
    return -torch.stack([lp[-1] for lp in logprobs]).mean()


@torch.no_grad()
def move_accuracy(policy: Policy, pushes: list[FinalPush], batch_size: int = 32) -> float:
    """The share of `pushes` whose winning move the policy ranks first among Sokoban's four moves."""
    moves = [policy.tokenizer.convert_tokens_to_ids(move) for move in ACTIONS]
    right = 0
    for start in range(0, len(pushes), batch_size):
        chunk = pushes[start : start + batch_size]
        # One forward per candidate move: the score of the move token after each context.
        scores = torch.stack([
            torch.stack([lp[-1] for lp in policy.score(
                [p.context for p in chunk],
                [[*p.response_ids[: p.move_index], move] for p in chunk],
                micro_batch_size=len(chunk),
                return_entropy=False,
            ).logprobs])
            for move in moves
        ])
        best = scores.argmax(0).tolist()
        right += sum(moves[b] == p.response_ids[p.move_index] for b, p in zip(best, chunk, strict=True))
    return right / len(pushes)


def train_perception(
    policy: Policy, train: list[FinalPush], held_out: list[FinalPush], steps: int, *, seed: int,
    lr: float = LR, batch_size: int = BATCH_SIZE, every: int = 100, show_progress: bool = True,
) -> list[float]:
    """`steps` AdamW steps, each on `batch_size` final pushes and as many fresh lookup documents; returns
    the held-out move accuracy every `every` steps (the first entry: before training)."""
    rng = random.Random(seed)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    curve = [round(move_accuracy(policy, held_out), 4)]
    with Phase("warm start: perception pretraining", steps, "steps", enabled=show_progress) as bar:
        for step in range(1, steps + 1):
            with policy.update_mode():
                loss = move_loss(policy, rng.sample(train, min(batch_size, len(train))))
                loss = loss + lookup_batch(policy.model, policy.tokenizer, rng, batch_size)[0]
                loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            policy.on_weights_updated()
            bar.update()
            if step % every == 0 or step == steps:
                curve.append(round(move_accuracy(policy, held_out), 4))
    return curve


def perception_pretrained(
    start: Path, steps: int, states: int, model: ModelConfig, env: EnvConfig, *, seed: int,
    show_progress: bool = True,
) -> Path:
    """`start` after `steps` of perception pretraining on `states` final pushes of `env` (and a quarter as
    many more, at most `HELD_OUT`, for the held-out curve), loaded with `model`'s settings (device, image
    sizes), in `<start>-perception/`. Reused while its key matches: the settings, `start` (weights and
    config), this file and the training data itself, so a change to the prompts or frames retrains."""
    out_dir = start.with_name(f"{start.name}-perception")
    frozen_tower = model.model_copy(update={"freeze_vision_tower": True})  # as RL keeps it: the decoder learns
    policy = Policy.from_config(frozen_tower, path=start, seed=seed)
    held_out = max(1, min(HELD_OUT, states // 4))
    pushes = final_pushes(policy, env, states + held_out, seed=env.train_seed_start, rng=random.Random(seed))
    settings = {"steps": steps, "states": states, "seed": seed, "lr": LR, "batch_size": BATCH_SIZE}
    key = content_digest(
        json.dumps(settings, sort_keys=True), model_digest(start), Path(__file__).read_bytes(), _digest(pushes)
    )
    summary = out_dir / SUMMARY_FILE
    if summary.is_file() and json.loads(summary.read_text()).get("key") == key:
        return out_dir
    curve = train_perception(policy, pushes[:states], pushes[states:], steps, seed=seed, show_progress=show_progress)
    with atomic_directory(out_dir) as tmp:
        policy.save_pretrained(tmp)
        atomic_write_text(tmp / SUMMARY_FILE, json.dumps({"key": key, **settings, "move_accuracy": curve}) + "\n")
    return out_dir


def _digest(pushes: list[FinalPush]) -> str:
    """A digest of the examples: every text part, frame and answer token."""
    parts: list[str | bytes] = []
    for push in pushes:
        for message in push.context:
            content = message["content"]
            for part in content if isinstance(content, list) else [{"type": "text", "text": content}]:
                parts.append(part["image"].tobytes() if part["type"] == "image" else part["text"])
        parts.append(json.dumps([push.response_ids, push.move_index]))
    return content_digest(*parts)
