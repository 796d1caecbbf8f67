"""Does a model quote a route of N moves? The copy that the self-analyzer's workflow skills need.

    python scripts/copy_probe.py --model runs/reproduce/warmstart/model [--examples 300] [env.cell_px=28 ...]
    python scripts/copy_probe.py --run runs/reproduce/sokoban-opsd-seed0 [--steps 30]

With `--model`, nothing is trained. For each route length, the share of examples whose quote the model
predicts token for token (teacher-forced, every token of the quote from its first move on more likely than
not), in three formats: `document`, lookup pretraining's raw copy documents ("Actions taken: step 1 up, ...",
then a skill quoting the route); `drill`, the warm start's copy drills (the same route in a chat prompt,
answered with the analyzer's JSON); and `analyzer`, the real analyzer prompt of held-out solver episodes of
the recipe's Sokoban env (`--config`, plus KEY=VALUE overrides), answered with the scripted analyzer's skill.
A pretrained model knows the first format, a warm-started one the other two.
With `--run` (a run with a self analyzer, e.g. SEED or GRPO+OPSD), the question on what the run wrote: of the
won training episodes of its first `--steps` updates, the share whose self-written skill quotes the winning
route (what the scripted analyzer's skill states), by the episode's length.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import torch

from seed_vl.config import ConfigError, load_config
from seed_vl.envs.registry import make_env
from seed_vl.policy import Policy
from seed_vl.report import read_trajectories, trajectory_steps
from seed_vl.sft import SFTExample
from seed_vl.toy.lookup_pretraining import copy_document, copy_drill
from seed_vl.toy.skill_probe import skill_agrees
from seed_vl.toy.warmstart import analyzer_examples, env_config

LONGEST = 7  # routes of 7+ moves are counted together
MAJORITY = math.log(0.5)  # a quoted token must be more likely than not


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="an HF image-text-to-text model directory")
    source.add_argument("--run", help="a run directory whose trajectories hold self-analyzer skills")
    parser.add_argument("--examples", type=int, default=300, help="examples of each format (--model)")
    parser.add_argument("--steps", type=int, default=None, help="the run's first N updates (--run; default all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default="configs/tiny/sokoban_visual.yaml", help="the analyzer pairs' recipe")
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE settings of that recipe, e.g. env.cell_px=28")
    args = parser.parse_args(argv)
    if args.examples < 1:
        parser.error(f"--examples: must be >= 1, got {args.examples}")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps: must be >= 1, got {args.steps}")
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

    try:
        config = load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    policy = Policy.from_pretrained(args.model, trainable=False)
    rng = random.Random(args.seed)
    documents = [_document(policy.tokenizer, rng) for _ in range(args.examples)]
    drills = [copy_drill(rng) for _ in range(args.examples)]
    formats = {
        "document": [(route, _raw_quotes(policy, text, route)) for text, route in documents],
        "drill": _chat_quotes(policy, drills),
        "analyzer": _chat_quotes(policy, _analyzer_pairs(config, policy, args.examples, rng)),
    }
    for name, quotes in formats.items():
        right: dict[int, list[bool]] = defaultdict(list)
        for route, quoted in quotes:
            right[min(len(re.findall(r"step \d+ ", route)), LONGEST)].append(quoted)
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
            right[min(len(actions), LONGEST)].append(skill_agrees(env, record["seed"], actions, record["skill"]))
    if not right:
        raise ConfigError(f"{run_dir}: no won episode in its saved trajectories")
    return right


def _document(tokenizer, rng: random.Random) -> tuple[str, str]:
    text = tokenizer.decode(copy_document(tokenizer, rng)[0])
    return text, text.split("\n", 1)[0].removeprefix("Actions taken: ")


def _analyzer_pairs(config, policy: Policy, episodes: int, rng: random.Random) -> list[SFTExample]:
    """Stage-1 pairs of unseen Sokoban episodes (seeds halfway to the evaluation range, which no warm start
    or training run reaches), the won ones whose skill quotes the route."""
    env = env_config(config, "sokoban_visual")
    held_out = env.model_copy(update={"train_seed_start": env.eval_seed_start // 2})
    pairs = analyzer_examples(config, held_out, episodes, policy.image_settings, rng)
    return [pair for pair in pairs if (route := _route_of(pair)) and route in pair.response]


def _route_of(example: SFTExample) -> str:
    content = example.context[-1]["content"]
    text = content if isinstance(content, str) else content[-1]["text"]
    return text.split("Actions taken: ", 1)[1].split("\n", 1)[0] if "Actions taken: " in text else ""


def _quoted_tokens(tokenizer, text: str, route: str) -> tuple[list[int], list[int]]:
    """`text`'s token ids and the positions of the tokens of the route's last occurrence, from its first move on."""
    start = text.rindex(route)
    first_move, end = start + len("step 1 "), start + len(route)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return encoded.input_ids, [k for k, (a, b) in enumerate(encoded.offset_mapping) if b > first_move and a < end]


@torch.no_grad()
def _raw_quotes(policy: Policy, text: str, route: str) -> bool:
    ids, quoted = _quoted_tokens(policy.tokenizer, text, route)
    logprobs = torch.log_softmax(policy.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return all(float(logprobs[k - 1, ids[k]]) > MAJORITY for k in quoted)


def _chat_quotes(policy: Policy, examples: list[SFTExample]) -> list[tuple[str, bool]]:
    """(route, quoted) for chat examples whose answer quotes the route of their prompt's action line."""
    routes = [_route_of(example) for example in examples]
    encoded = [_quoted_tokens(policy.tokenizer, e.response, route) for e, route in zip(examples, routes, strict=True)]
    scores = policy.score([e.context for e in examples], [ids for ids, _ in encoded], return_entropy=False)
    return [
        (route, all(float(logprobs[k]) > MAJORITY for k in quoted))
        for route, (_, quoted), logprobs in zip(routes, encoded, scores.logprobs, strict=True)
    ]


if __name__ == "__main__":
    raise SystemExit(main())
