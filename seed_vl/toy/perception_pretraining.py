"""Perception pretraining: the sight, and the use of a hint, that a pretrained VL model brings and the tiny
one lacks.

A policy that cannot tell on which side of it the box lies answers one move whatever it sees, and RL from
it would have to learn perception from the reward alone. The warm start's behaviour cloning does not teach
it: a move is one token in twenty-five of a demonstration's answer, the history frames and the previous
moves predict much of it without looking, and the recipe's SFT freezes the decoder's attention, the only
place where the relation of the player's cell to the box's cell can be learnt. `warmstart.perception_steps`
therefore first trains the barest decision a frame makes, in the policy's own prompt: a room one push from
solved (the last state of a solver demonstration), shown with no history, -> the winning move, the loss on
the move only; the vision tower stays frozen and lookup documents fill half of every batch so that the
lookup pretraining before it survives.

A base that only sees learns to ignore a skill: the frame already decides every move it was shown. So the
same batches also draw from `warmstart.perception_skill_turns` skill turns: every turn of a varied plan
(another move order, a detour first) in the policy's prompt with its history, the scripted skill naming
that plan in context, -> the plan's move, which the frame alone does not decide; the lookup pretraining's
bare route documents do not carry over to the prompt on their own. `warmstart.perception_drills` and
`warmstart.skill_drills` mix both kinds into the SFT as chat examples, as lookup drills keep the lookup:
without them the SFT unlearns sight even with attention and tower frozen, and it unlearns reading too.
EZPoints asks the same of its cards: the warm start's base answers one first number whatever the cards show
(`scripts/first_moves.py`), so `warmstart.perception_first_numbers` adds EZPoints first turns to the same
batches: the two cards and an empty formula -> the solver's first number (the smaller card's value), which
only the frame gives, and `warmstart.first_number_drills` mixes them into the SFT. They are dealt as
`uniform_pair` (envs/ezpoints.py) whatever the recipe deals, as pretraining sees every card alike.
A stand-in for pretraining, not part of SEED; visual Sokoban, and visual EZPoints beside it.

Measured on the Sokoban recipe (one run each; README, "Perception pretraining"): on final pushes alone the
held-out move accuracy stays near chance to 47% for 500 steps, then jumps to 100% by step 600; with skill
turns in the batches the jump comes later (100% at step 1,500) and skill turns reach 93%; the base then
wins 84% of held-out tasks with the correct skill, 47% with none and 12% with a wrong one.

`perception_pretrained` caches its result beside the model it starts from, keyed by the settings, that
model (weights and config), this file and the training data itself; `perception.json` holds the held-out
move accuracy curves of both kinds.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seed_vl.config import EnvConfig, ModelConfig
from seed_vl.envs.ezpoints import NUMBERS
from seed_vl.envs.sokoban import ACTIONS
from seed_vl.io import atomic_directory, atomic_write_text, content_digest, model_digest
from seed_vl.policy import Policy
from seed_vl.processors.images import ImageSettings
from seed_vl.rollout import derive_seed
from seed_vl.sft import SFTExample
from seed_vl.toy import demonstrations
from seed_vl.toy.demonstrations import play_demonstrations, terse_response
from seed_vl.toy.lookup_pretraining import lookup_batch
from seed_vl.tracking import Phase

BATCH_SIZE, LR, HELD_OUT = 16, 1e-3, 128
SUMMARY_FILE = "perception.json"
_SKILL_STREAM = 0x5E1F  # the skill turns' draws (plans, phrasing)
_FIRST_NUMBER_STREAM = 0xCA2D  # the first numbers' draws (phrasing)
# What a held-out turn of each kind is ranked among: Sokoban's moves, or the first token of each number
# ('1' for 10: no card is worth 1).
CANDIDATES = {"final_push": ACTIONS, "skill_turn": ACTIONS, "first_number": tuple(sorted({n[0] for n in NUMBERS}))}


@dataclass(frozen=True)
class MoveTurn:
    """A turn's context, its answer's token ids and the index of the move among them."""

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


def first_number_turns(
    env: EnvConfig, count: int, *, seed: int, image_settings: ImageSettings | None, rng: random.Random
) -> list[SFTExample]:
    """The first turn of `count` EZPoints solver demonstrations on the training seeds from `seed`, dealt as
    `uniform_pair`: the cards and an empty formula, answered with the solver's first number."""
    env = env.model_copy(update={"ezpoints_deal": "uniform_pair"})
    episodes = play_demonstrations(env, count, seed=seed, history_window=0, image_settings=image_settings, rng=rng)
    return [SFTExample(e.turns[0].context, terse_response(e.turns[0].response_text)) for e in episodes]


def move_turns(policy: Policy, examples: list[SFTExample]) -> list[MoveTurn]:
    """Terse-answered turns, tokenized, with the index of the move in each answer."""
    encode = lambda text: policy.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    return [
        MoveTurn(e.context, encode(e.response), len(encode(e.response[: e.response.index("</think>")] + "</think><action>")))
        for e in examples
    ]


def move_loss(policy: Policy, turns: list[MoveTurn]) -> torch.Tensor:
    """The mean NLL of the turns' moves (the answers up to the move: the think text carries no loss)."""
    logprobs = policy.score(
        [t.context for t in turns],
        [t.response_ids[: t.move_index + 1] for t in turns],
        micro_batch_size=len(turns),
        with_grad=True,
        return_entropy=False,
    ).logprobs
    return -torch.stack([lp[-1] for lp in logprobs]).mean()


def move_accuracy(
    policy: Policy, turns: list[MoveTurn], batch_size: int = 32, candidates: tuple[str, ...] = ACTIONS
) -> float:
    """The share of `turns` whose move the policy ranks first among `candidates` (single tokens)."""
    ranked = top_moves(policy, turns, batch_size, candidates)
    return sum(move == t.response_ids[t.move_index] for move, t in zip(ranked, turns, strict=True)) / len(turns)


@torch.no_grad()
def top_moves(
    policy: Policy, turns: list[MoveTurn], batch_size: int = 32, candidates: tuple[str, ...] = ACTIONS
) -> list[int]:
    """The token among `candidates` that the policy ranks first at each turn's move."""
    moves = [policy.tokenizer.convert_tokens_to_ids(move) for move in candidates]
    ranked: list[int] = []
    for start in range(0, len(turns), batch_size):
        chunk = turns[start : start + batch_size]
        # One forward per candidate move: the score of the move token after each context.
        scores = torch.stack([
            torch.stack([lp[-1] for lp in policy.score(
                [t.context for t in chunk],
                [[*t.response_ids[: t.move_index], move] for t in chunk],
                micro_batch_size=len(chunk),
                return_entropy=False,
            ).logprobs])
            for move in moves
        ])
        ranked += [moves[best] for best in scores.argmax(0).tolist()]
    return ranked


def train_perception(
    policy: Policy, train: list[MoveTurn], held_out: dict[str, list[MoveTurn]], steps: int, *, seed: int,
    lr: float = LR, batch_size: int = BATCH_SIZE, every: int = 100, show_progress: bool = True,
) -> dict[str, list[float]]:
    """`steps` AdamW steps, each on `batch_size` turns drawn from `train` and as many fresh lookup documents;
    returns the move accuracy on each `held_out` set (keys of `CANDIDATES`) every `every` steps (the first
    entry: before training)."""
    rng = random.Random(seed)
    params = [p for p in policy.model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def accuracy(name: str) -> float:
        return round(move_accuracy(policy, held_out[name], candidates=CANDIDATES[name]), 4)

    curves = {name: [accuracy(name)] for name in held_out}
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
                for name in held_out:
                    curves[name].append(accuracy(name))
    return curves


def perception_pretrained(
    start: Path, steps: int, states: int, model: ModelConfig, env: EnvConfig, *, seed: int,
    skill_turns: int = 0, history_window: int = 0, first_numbers: int = 0, ezpoints: EnvConfig | None = None,
    show_progress: bool = True,
) -> Path:
    """`start` after `steps` of perception pretraining on `states` final pushes of `env`, `skill_turns`
    skill turns (shown with `history_window` earlier turns) and `first_numbers` first turns of `ezpoints`,
    plus up to `HELD_OUT` more of each for the held-out curves, loaded with `model`'s settings (device, image
    sizes), in `<start>-perception/`. Reused while its key matches: the settings, `start` (weights and
    config), this file and the training data itself, so a change to the prompts or frames retrains."""
    if first_numbers and ezpoints is None:
        raise ValueError("first_numbers: pass the EZPoints environment they are dealt in")
    out_dir = start.with_name(f"{start.name}-perception")
    frozen_tower = model.model_copy(update={"freeze_vision_tower": True})  # as RL keeps it: the decoder learns
    policy = Policy.from_config(frozen_tower, path=start, seed=seed)
    images = policy.image_settings
    split = {"final_push": states, "skill_turn": skill_turns, "first_number": first_numbers}
    turns = {
        "final_push": move_turns(policy, final_push_turns(
            env, states + _held_out(states), seed=env.train_seed_start, image_settings=images, rng=random.Random(seed),
        )),
        "skill_turn": move_turns(policy, demonstrations.skill_turns(
            env, skill_turns + _held_out(skill_turns), seed=env.train_seed_start, history_window=history_window,
            image_settings=images, rng=random.Random(derive_seed(_SKILL_STREAM, seed)),
        )) if skill_turns else [],
    }
    if first_numbers:
        turns["first_number"] = move_turns(policy, first_number_turns(
            ezpoints, first_numbers + _held_out(first_numbers), seed=ezpoints.train_seed_start, image_settings=images,
            rng=random.Random(derive_seed(_FIRST_NUMBER_STREAM, seed)),
        ))
    settings = {"steps": steps, "states": states, "skill_turns": skill_turns, "first_numbers": first_numbers,
                "history_window": history_window, "seed": seed, "lr": LR, "batch_size": BATCH_SIZE}
    key = content_digest(
        json.dumps(settings, sort_keys=True), model_digest(start), Path(__file__).read_bytes(),
        *(_digest(kind) for kind in turns.values()),
    )
    summary = out_dir / SUMMARY_FILE
    if summary.is_file() and json.loads(summary.read_text()).get("key") == key:
        return out_dir
    train = [turn for name, kind in turns.items() for turn in kind[: split[name]]]
    # Held out: the turns after the training ones (a skill turn's episode may straddle the boundary).
    held_out = {name: kind[split[name]:] for name, kind in turns.items() if kind}
    curves = train_perception(policy, train, held_out, steps, seed=seed, show_progress=show_progress)
    with atomic_directory(out_dir) as tmp:
        policy.save_pretrained(tmp)
        atomic_write_text(tmp / SUMMARY_FILE, json.dumps({"key": key, **settings, "move_accuracy": curves}) + "\n")
    return out_dir


def _held_out(count: int) -> int:
    return max(1, min(HELD_OUT, count // 4)) if count else 0


def _digest(turns: list[MoveTurn]) -> str:
    """A digest of the examples: every text part, frame and answer token."""
    parts: list[str | bytes] = []
    for turn in turns:
        for message in turn.context:
            content = message["content"]
            for part in content if isinstance(content, list) else [{"type": "text", "text": content}]:
                parts.append(part["image"].tobytes() if part["type"] == "image" else part["text"])
        parts.append(json.dumps([turn.response_ids, turn.move_index]))
    return content_digest(*parts)
