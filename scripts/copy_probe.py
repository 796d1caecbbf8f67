"""Does a model quote a route of N moves? The copy that the self-analyzer's workflow skills need.

    python scripts/copy_probe.py --model runs/reproduce/warmstart/model [--examples 300]
    python scripts/copy_probe.py --run runs/reproduce/sokoban-opsd-seed0 [--steps 30]

With `--model`, nothing is trained. For each route length, the share of examples whose quote the model predicts token for
token (teacher-forced argmax, from the quote's first move to its last), in two formats:
`document`, lookup pretraining's raw copy documents ("Actions taken: step 1 up, ...", then a skill quoting the
route), and `drill`, the warm start's copy drills (the same route in a chat prompt, answered with the
analyzer's JSON). A pretrained model knows the first format, a warm-started one the second.
With `--run` (a run with a self analyzer, e.g. SEED or GRPO+OPSD), the same question on the real analyzer
prompt: of the won training episodes of its first `--steps` updates, the share whose self-written skill
quotes the winning route (what the scripted analyzer's skill states), by the episode's length.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from seed_vl.config import ConfigError, load_config
from seed_vl.envs.registry import make_env
from seed_vl.report import read_trajectories, trajectory_steps
from seed_vl.toy.lookup_pretraining import copy_document, copy_drill

LONGEST = 7  # routes of 7+ moves are counted together


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="an HF image-text-to-text model directory")
    source.add_argument("--run", help="a run directory whose trajectories hold self-analyzer skills")
    parser.add_argument("--examples", type=int, default=300, help="examples of each format (--model)")
    parser.add_argument("--steps", type=int, default=None, help="the run's first N updates (--run; default all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error(f"--examples: must be >= 1, got {args.examples}")
    if args.run is not None:
        try:
            right = _run_quotes(Path(args.run), args.steps)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"won episodes whose skill quotes the winning route, by length: {_cells(right)}")
        return 0
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: no model at {args.model}")

    tokenizer = AutoProcessor.from_pretrained(args.model).tokenizer
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32).eval()
    rng = random.Random(args.seed)
    for name, make in (("document", _document), ("drill", _drill)):
        right: dict[int, list[bool]] = defaultdict(list)
        for _ in range(args.examples):
            text, route = make(tokenizer, rng)
            right[min(len(re.findall(r"step \d+ ", route)), LONGEST)].append(_quotes(model, tokenizer, text, route))
        print(f"{name:8s} quotes right, by route length: {_cells(right)}", flush=True)
    return 0


def _cells(right: dict[int, list[bool]]) -> str:
    return ", ".join(f"{n}{'+' if n == LONGEST else ''}: {sum(r)}/{len(r)}" for n, r in sorted(right.items()))


def _run_quotes(run_dir: Path, steps: int | None) -> dict[int, list[bool]]:
    env = make_env(load_config(run_dir / "config.yaml", []).env)
    right: dict[int, list[bool]] = defaultdict(list)
    step_dirs = [d for _, d in sorted(trajectory_steps(run_dir).items())][:steps]
    for record in (r for d in step_dirs for r in read_trajectories(d / "trajectories.jsonl")):
        if record["won"]:
            actions = [turn["action"] for turn in record["turns"]]
            facts = env.hindsight_facts(record["seed"], actions)
            quoted = record["skill"] is not None and any(fact in record["skill"] for fact in facts)
            right[min(len(actions), LONGEST)].append(quoted)
    if not right:
        raise ConfigError(f"{run_dir}: no won episode in its saved trajectories")
    return right


def _document(tokenizer, rng: random.Random) -> tuple[str, str]:
    text = tokenizer.decode(copy_document(tokenizer, rng)[0])
    return text, text.split("\n", 1)[0].removeprefix("Actions taken: ")


def _drill(tokenizer, rng: random.Random) -> tuple[str, str]:
    drill = copy_drill(rng)
    prompt = tokenizer.apply_chat_template(drill.context, add_generation_prompt=True, tokenize=False)
    return prompt + drill.response, drill.context[0]["content"].split("Actions taken: ", 1)[1]


@torch.no_grad()
def _quotes(model, tokenizer, text: str, route: str) -> bool:
    """Whether every token of the route's last occurrence in `text`, from its first move on, is the model's
    argmax given the tokens before it."""
    start = text.rindex(route)
    first_move, end = start + len("step 1 "), start + len(route)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    quoted = [k for k, (a, b) in enumerate(encoded.offset_mapping) if b > first_move and a < end]
    predicted = model(input_ids=torch.tensor([encoded.input_ids])).logits[0].argmax(-1)
    return all(int(predicted[k - 1]) == encoded.input_ids[k] for k in quoted)


if __name__ == "__main__":
    raise SystemExit(main())
