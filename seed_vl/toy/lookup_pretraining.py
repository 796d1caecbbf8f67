"""Lookup pretraining: the in-context retrieval that a pretrained model brings and the tiny one lacks.

Following a route skill is one lookup: the turn's step number ("Current observation (step 3)", echoed in
the answer's "... at step 3") finds "step 3 up" in the skill, and the move is copied into `<action>`.
Writing one is a copy: the self analyzer quotes the prompt's "Actions taken: step 1 up, ..." in its skill.
A real instruct model learned both in pretraining; the randomly initialised tiny model has not, and the
warm start's SFT alone does not teach them. `warmstart.lookup_steps` first trains them by plain language
modelling on synthetic text, half of each batch of each kind: lookup documents (a route in one of the
Sokoban env's winning-skill phrasings, then lookups of its steps in the answer format) and copy documents
(a route in the analyzer prompt's wording, then a winning skill quoting it), the loss on the looked-up
moves and on the quote only; `warmstart.lookup_drills` mixes both, as chat examples, into the SFT. A stand-in for
pretraining, not part of SEED; Sokoban's moves only.

Measured on the Sokoban recipe (lookup.json; README, "Copy documents"): the lookup's move accuracy jumps
from about 50% to 95-98% (chance 25%) after 300 to 1,100 steps depending on incidental details of the
tokenizer's build; the copy is learnt first and steadily (99% by step 1,100). The warm start's SFT unlearns
the lookup unless `warmstart.freeze_attention` keeps the decoder's attention, where it lives, out of the
SFT (86% kept from 98%). The Sokoban recipe turns all three on.

`lookup_pretrained` caches its result beside the base model; `scripts/lookup_probe.py` runs `train_lookup`
on any model.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoProcessor, PreTrainedModel

from seed_vl.analyzer import format_analysis
from seed_vl.envs.base import step_route
from seed_vl.envs.sokoban import winning_skill
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
    """(token ids, labels): a random route in one of the winning skills' phrasings, then `lookups` of its
    steps in random order, each in the answer format; labels are -100 except on the looked-up moves. As bare
    as that: with a skill block and observation headings around them, 600 steps reached only 50%."""
    route, steps = _route_and_lookups(rng, lookups)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    ids = encode(f"[{winning_skill(route, rng)}]\n")
    labels = [-100] * len(ids)
    for k in steps:
        query, move, close = encode(f"{_THINK.format(k=k)}<action>"), encode(route[k - 1]), encode("</action>\n")
        ids += query + move + close
        labels += [-100] * len(query) + move + [-100] * len(close)
    return ids, labels


def copy_document(tokenizer: Any, rng: random.Random) -> tuple[list[int], list[int]]:
    """(token ids, labels): a route in the analyzer prompt's wording ("Actions taken: step 1 up, ..."), then
    a winning skill quoting it as the analyzer's answer does; labels are -100 except on the quote from its
    first move to the end, so that where the route ends, the quote ends too."""
    moves = _route(rng, shortest=1)
    route = step_route(moves)
    head, tail = winning_skill(moves, rng).split(route)
    actions = f"Actions taken: {route}\n"
    text = f'{actions}{{"episode_skill": "{head}{route}{tail}"}}\n'
    first_move = text.index(route, len(actions)) + len("step 1 ")  # in the route's second occurrence
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    labels = [  # the tokens ending past the first move's start (" up" is one token with some tokenizers)
        token if end > first_move else -100
        for token, (_, end) in zip(encoded.input_ids, encoded.offset_mapping, strict=True)
    ]
    return encoded.input_ids, labels


def lookup_drill(rng: random.Random, lookups: int = LOOKUPS) -> SFTExample:
    """A lookup document as a chat example for the warm start's SFT: the route in a skill block as the user
    message, its lookups as the answer."""
    route, steps = _route_and_lookups(rng, lookups)
    answer = "\n".join(f"{_THINK.format(k=k)}<action>{route[k - 1]}</action>" for k in steps)
    return SFTExample([{"role": "user", "content": skill_block(winning_skill(route, rng))}], answer)


def copy_drill(rng: random.Random) -> SFTExample:
    """A copy document as a chat example: the route as the analyzer prompt words it, then the analyzer's JSON
    answer with a winning skill quoting it."""
    route = _route(rng, shortest=1)
    prompt = f"Outcome: success\nActions taken: {step_route(route)}"
    answer = format_analysis(f"Solved the room in {len(route)} steps.", winning_skill(route, rng))
    return SFTExample([{"role": "user", "content": prompt}], answer)


def _route(rng: random.Random, shortest: int = 3) -> list[str]:
    return [rng.choice(MOVES) for _ in range(rng.randint(shortest, MAX_ROUTE))]


def _route_and_lookups(rng: random.Random, lookups: int) -> tuple[list[str], list[int]]:
    route = _route(rng)
    return route, rng.sample(range(1, len(route) + 1), min(lookups, len(route)))


DOCUMENTS = {"lookup": lookup_document, "copy": copy_document}


def lookup_batch(
    model: PreTrainedModel, tokenizer: Any, rng: random.Random, batch_size: int
) -> tuple[torch.Tensor, dict[str, tuple[int, int]]]:
    """One batch of fresh documents, half of each kind: (mean loss on the labelled tokens, {kind: (labelled
    tokens predicted right, labelled tokens)})."""
    kinds = [list(DOCUMENTS)[k % len(DOCUMENTS)] for k in range(batch_size)]
    docs = [DOCUMENTS[kind](tokenizer, rng) for kind in kinds]
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
    logits = model.lm_head(hidden[keep])  # the labelled positions only: a fraction of the tokens
    loss = torch.nn.functional.cross_entropy(logits.float(), targets[keep])
    right = torch.zeros_like(targets, dtype=torch.bool)
    right[keep] = logits.argmax(-1) == targets[keep]
    counts = {kind: (0, 0) for kind in DOCUMENTS}
    for row, kind in enumerate(kinds):
        done, total = counts[kind]
        counts[kind] = (done + int(right[row].sum()), total + int(keep[row].sum()))
    return loss, counts


def train_lookup(
    model: PreTrainedModel, tokenizer: Any, steps: int, *, seed: int, lr: float = LR, batch_size: int = BATCH_SIZE,
    log: Callable[[int, dict[str, float]], None] | None = None, every: int = 100, show_progress: bool = True,
) -> dict[str, list[float]]:
    """`steps` AdamW steps on fresh documents (drawn from `seed`); returns each kind's move accuracy over
    every `every` steps."""
    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    curves: dict[str, list[float]] = {kind: [] for kind in DOCUMENTS}
    window: list[dict[str, tuple[int, int]]] = []
    with Phase("warm start: lookup pretraining", steps, "steps", enabled=show_progress) as bar:
        for step in range(1, steps + 1):
            loss, counts = lookup_batch(model, tokenizer, rng, batch_size)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            window.append(counts)
            bar.update()
            if step % every == 0 or step == steps:
                for kind, accuracy in _accuracies(window).items():
                    curves[kind].append(round(accuracy, 4))
                if log is not None:
                    log(step, {kind: curve[-1] for kind, curve in curves.items()})
                window = []
    model.eval()
    return curves


@torch.no_grad()
def lookup_accuracy(model: PreTrainedModel, tokenizer: Any, *, batches: int = 8, seed: int = 123) -> dict[str, float]:
    """Each kind's share of moves the model gets right on `batches` batches of fresh documents (no training):
    whether a model still holds the lookup and the copy, e.g. after the warm start's SFT."""
    rng = random.Random(seed)
    model.eval()
    return _accuracies([lookup_batch(model, tokenizer, rng, BATCH_SIZE)[1] for _ in range(batches)])


def _accuracies(counts: list[dict[str, tuple[int, int]]]) -> dict[str, float]:
    return {kind: sum(c[kind][0] for c in counts) / max(1, sum(c[kind][1] for c in counts)) for kind in DOCUMENTS}


def lookup_pretrained(base: Path, steps: int, *, seed: int, device: str = "auto", show_progress: bool = True) -> Path:
    """`base` after `steps` of lookup pretraining, in `<base>-lookup/`. Reused while its key matches: the
    settings, the base model (weights and config), this file and the first documents themselves (their
    phrasings come from the Sokoban env's skills)."""
    out_dir = base.with_name(f"{base.name}-lookup")
    settings = json.dumps({"steps": steps, "seed": seed, "lr": LR, "batch_size": BATCH_SIZE})
    tokenizer = AutoProcessor.from_pretrained(base).tokenizer
    rng = random.Random(seed)
    documents = json.dumps([make(tokenizer, rng) for _ in range(BATCH_SIZE) for make in DOCUMENTS.values()])
    key = content_digest(settings, model_digest(base), Path(__file__).read_bytes(), documents)
    summary = out_dir / SUMMARY_FILE
    if summary.is_file() and json.loads(summary.read_text()).get("key") == key:
        return out_dir
    policy = Policy.from_pretrained(base, device=device, seed=seed)
    curves = train_lookup(policy.model, policy.tokenizer, steps, seed=seed, show_progress=show_progress)
    with atomic_directory(out_dir) as tmp:
        policy.save_pretrained(tmp)
        atomic_write_text(tmp / SUMMARY_FILE, json.dumps({"key": key, "steps": steps, "move_accuracy": curves}) + "\n")
    return out_dir
