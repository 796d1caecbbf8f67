"""Lookup pretraining: the in-context retrieval that a pretrained model brings and the tiny one lacks.

Following a route skill is one lookup: the turn's step number ("Current observation (step 3)", echoed in
the answer's "... at step 3") finds "step 3 up" in the skill, and the move is copied into `<action>`. A real
instruct model learned such retrieval in pretraining; the randomly initialised tiny model has not, and the
warm start's SFT alone does not teach it. `warmstart.lookup_steps` first trains it by plain language
modelling on synthetic text (a route in the skills' wording, then lookups of its steps in the answer
format, the loss on the looked-up moves only); `warmstart.lookup_drills` mixes the same documents into the
SFT as chat examples. A stand-in for pretraining, not part of SEED; Sokoban's moves only.

Measured on the Sokoban recipe: the move accuracy jumps from about 50% to 95-98% (chance 25%) after about
300 steps with one build of the tiny tokenizer and after 700-1,100 with another (the same token boundaries,
other ids): 600 steps reached 98% or 52% depending on the build, so the recipe runs 1,500 (6 minutes; 97.8%
with the current build, the jump at steps 900-1,100). The warm
start's SFT unlearns it (16-26% afterwards, `lookup_accuracy`); with 1,200 drills in the SFT the
self-analyzer's skills quote more winning routes, yet the policy still ignores a skill. With
`warmstart.freeze_attention` too, the lookup partly survives the SFT (86% from 98%, 45% from 52%) and the
base reads skills (docs/RESULTS-quick.md). The Sokoban recipe turns all three on.

`lookup_pretrained` caches its result beside the base model, keyed by the settings, the base model (weights and config) and
this file; `scripts/lookup_probe.py` runs `train_lookup` on any model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from seed_vl.envs.base import step_route
from seed_vl.io import atomic_directory, atomic_write_text, content_digest, model_digest
from seed_vl.policy import Policy
from seed_vl.sft import SFTExample
from seed_vl.skills import skill_block
from seed_vl.tracking import Phase

MOVES = ("up", "down", "left", "right")
BATCH_SIZE, LR, MAX_ROUTE, LOOKUPS = 32, 1e-3, 12, 6
SUMMARY_FILE = "lookup.json"
_THINK = "<think>I push the box at step {k}</think>"  # a demonstration's think: the step, never the move


def lookup_document(tokenizer: Any, rng: random.Random, lookups: int = LOOKUPS) -> tuple[list[int], list[int]]:
    """(token ids, labels): a random route in the skills' wording, then `lookups` of its steps in random
    order, each in the answer format; labels are -100 except on the looked-up moves. As bare as that: with
    a skill block and observation headings around them, 600 steps reached only 50%."""
    route, steps = _route_and_lookups(rng, lookups)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    ids = encode(f"[{_route_skill(route)}]\n")
    labels = [-100] * len(ids)
    for k in steps:
        query, move, close = encode(f"{_THINK.format(k=k)}<action>"), encode(route[k - 1]), encode("</action>\n")
        ids += query + move + close
        labels += [-100] * len(query) + move + [-100] * len(close)
    return ids, labels


def lookup_drill(rng: random.Random, lookups: int = LOOKUPS) -> SFTExample:
    """A lookup document as a chat example for the warm start's SFT: the route in a skill block as the user
    message, its lookups as the answer."""
    route, steps = _route_and_lookups(rng, lookups)
    answer = "\n".join(f"{_THINK.format(k=k)}<action>{route[k - 1]}</action>" for k in steps)
    return SFTExample([{"role": "user", "content": skill_block(_route_skill(route))}], answer)


def _route_and_lookups(rng: random.Random, lookups: int) -> tuple[list[str], list[int]]:
    route = [rng.choice(MOVES) for _ in range(rng.randint(3, MAX_ROUTE))]
    return route, rng.sample(range(1, len(route) + 1), min(lookups, len(route)))


def _route_skill(route: list[str]) -> str:
    return f"Winning order: {step_route(route)}."


def lookup_batch(
    model: PreTrainedModel, tokenizer: Any, rng: random.Random, batch_size: int
) -> tuple[torch.Tensor, int, int]:
    """One batch of fresh documents: (mean loss on the moves, moves predicted right, moves)."""
    docs = [lookup_document(tokenizer, rng) for _ in range(batch_size)]
    width = max(len(ids) for ids, _ in docs)
    device = model.device
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in docs], device=device)
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in docs], device=device)
    attention_mask = (torch.arange(width, device=device)[None] < torch.tensor(
        [len(ids) for ids, _ in docs], device=device)[:, None]).long()
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, :-1]
    targets = labels[:, 1:]
    keep = targets != -100
    logits = model.lm_head(hidden[keep])  # the moves' positions only: a tenth of the tokens
    loss = torch.nn.functional.cross_entropy(logits.float(), targets[keep])
    correct = int((logits.argmax(-1) == targets[keep]).sum())
    return loss, correct, int(keep.sum())


def train_lookup(
    model: PreTrainedModel, tokenizer: Any, steps: int, *, seed: int, lr: float = LR, batch_size: int = BATCH_SIZE,
    log: Callable[[int, float], None] | None = None, every: int = 100, show_progress: bool = True,
) -> list[float]:
    """`steps` AdamW steps on fresh documents (drawn from `seed`); returns the move accuracy of every
    `every` steps."""
    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curve, correct, total = [], 0, 0
    with Phase("warm start: lookup pretraining", steps, "steps", enabled=show_progress) as bar:
        for step in range(1, steps + 1):
            loss, right, count = lookup_batch(model, tokenizer, rng, batch_size)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            correct, total = correct + right, total + count
            bar.update()
            if step % every == 0 or step == steps:
                curve.append(round(correct / total, 4))
                if log is not None:
                    log(step, curve[-1])
                correct = total = 0
    model.eval()
    return curve


@torch.no_grad()
def lookup_accuracy(model: PreTrainedModel, tokenizer: Any, *, batches: int = 8, seed: int = 123) -> float:
    """The share of looked-up moves the model gets right on `batches` batches of fresh documents (no training):
    whether a model still holds the lookup, e.g. after the warm start's SFT."""
    rng = random.Random(seed)
    model.eval()
    counts = [lookup_batch(model, tokenizer, rng, BATCH_SIZE)[1:] for _ in range(batches)]
    return sum(right for right, _ in counts) / sum(total for _, total in counts)


def lookup_pretrained(base: Path, steps: int, *, seed: int, device: str = "auto", show_progress: bool = True) -> Path:
    """`base` after `steps` of lookup pretraining, in `<base>-lookup/` (reused while its key matches)."""
    out_dir = base.with_name(f"{base.name}-lookup")
    settings = json.dumps({"steps": steps, "seed": seed, "lr": LR, "batch_size": BATCH_SIZE})
    key = content_digest(settings, model_digest(base), Path(__file__).read_bytes())
    summary = out_dir / SUMMARY_FILE
    if summary.is_file() and json.loads(summary.read_text()).get("key") == key:
        return out_dir
    policy = Policy.from_pretrained(base, device=device, seed=seed)
    curve = train_lookup(policy.model, policy.tokenizer, steps, seed=seed, show_progress=show_progress)
    with atomic_directory(out_dir) as tmp:
        policy.save_pretrained(tmp)
        atomic_write_text(tmp / SUMMARY_FILE, json.dumps({"key": key, "steps": steps, "move_accuracy": curve}) + "\n")
    return out_dir
