"""`seed-vl` command line: `seed-vl COMMAND [--config PATH] [section.key=value ...]`.

Also runs as `python -m seed_vl.cli` (and so under `accelerate launch -m seed_vl.cli train ...`).
Any user error (bad recipe, override, path) prints one line and exits with status 2.
Ctrl-C and SIGTERM (`kill`, a scheduler's preemption) stop a command cleanly: status 130 and 143.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence

from seed_vl.config import ConfigError

QUICK_REPRODUCE = "configs/reproduce/quick.yaml"


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a scheduler's preemption or time limit), handled as Ctrl-C is: `finally` blocks run."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise Terminated


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and still exit status 2)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="PATH", help="YAML recipe (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="override recipe values")


def _cmd_make_tiny_model(args: argparse.Namespace) -> None:
    from seed_vl.toy.tiny_model import build_tiny_model

    out = build_tiny_model(args.out, text_only=args.text_only, seed=args.seed, arch=args.arch)
    print(f"tiny model written to {out}")


def _config(args: argparse.Namespace):
    from seed_vl.config import load_config

    config = load_config(args.config, args.overrides)
    if not config.logging.progress:  # also the Hugging Face bars (weights loading, saving)
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    return config


def _cmd_train(args: argparse.Namespace) -> None:
    from seed_vl.trainer import train

    train(_config(args), resume=args.resume, overwrite=args.overwrite)


def _cmd_eval(args: argparse.Namespace) -> None:
    from seed_vl.evaluation import run_evaluation

    for name, value in run_evaluation(_config(args)).items():
        print(f"{name}: {value:.4f}")


def _cmd_collect(args: argparse.Namespace) -> None:
    from seed_vl.stage1 import collect

    print(f"dataset written to {collect(_config(args))}")


def _cmd_sft(args: argparse.Namespace) -> None:
    from seed_vl.stage1 import sft

    print(f"fine-tuned model written to {sft(_config(args), resume=args.resume)}")


def _cmd_export(args: argparse.Namespace) -> None:
    from seed_vl.export import export

    print(f"model written to {export(args.checkpoint, args.out)}")


def _cmd_warmstart(args: argparse.Namespace) -> None:
    from seed_vl.toy.warmstart import run_warmstart

    print(f"warm-started model: {run_warmstart(_config(args))}")


def _cmd_reproduce(args: argparse.Namespace) -> None:
    from seed_vl.toy.reproduce import reproduce

    config = QUICK_REPRODUCE if args.quick and args.config is None else args.config
    results = reproduce(config, args.overrides, report_only=args.report_only, only=args.only)
    print(f"results written to {results}")


def _cmd_demo(args: argparse.Namespace) -> None:
    from seed_vl.toy.demo import run_demo

    run_demo(args.config, args.overrides)


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], None]]] = {
    "train": ("stage 2: RL with SEED or a baseline preset (algorithm.preset=grpo|opsd|sdar|seed)", _cmd_train),
    "eval": ("success rate and return of model.path on held-out seeds", _cmd_eval),
    "collect": ("stage 1: roll out the base policy and label trajectories with an analyzer", _cmd_collect),
    "sft": ("stage 1: fine-tune on analyzer prompt -> JSON pairs", _cmd_sft),
    "export": ("write a checkpoint's model as a plain HF checkpoint (LoRA adapters merged)", _cmd_export),
    "make-tiny-model": ("build the tiny Qwen-architecture model used by tests and the CPU demo", _cmd_make_tiny_model),
    "warmstart": ("the tiny model's stand-in for pretraining (cached; not part of SEED)", _cmd_warmstart),
    "demo": ("the CPU demo: warm start, then SEED on visual Sokoban with the tiny model", _cmd_demo),
    "reproduce": ("toy-scale GRPO / GRPO+OPSD / SEED comparison, writes docs/RESULTS.md", _cmd_reproduce),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="seed-vl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (help_text, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == "make-tiny-model":
            p.add_argument("--out", required=True, metavar="DIR")
            p.add_argument("--text-only", action="store_true", help="a Qwen2 causal LM instead of Qwen2.5-VL")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--arch", default="qwen2_5_vl", choices=["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
        elif name == "export":
            p.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint directory (or a run directory)")
            p.add_argument("--out", required=True, metavar="DIR")
        else:
            _add_config_args(p)
        if name in ("train", "sft"):
            p.add_argument("--resume", metavar="DIR", help="a run directory or checkpoint to continue from")
        if name == "train":
            p.add_argument("--overwrite", action="store_true", help="replace what the run directory holds")
        if name == "reproduce":
            p.add_argument("--quick", action="store_true", help=f"the short profile ({QUICK_REPRODUCE})")
            p.add_argument(
                "--report-only", action="store_true", help="re-render the results from finished runs, no training"
            )
            p.add_argument(
                "--only", action="append", default=[], metavar="RUN",
                help="train only the runs matching this name or glob (e.g. 'sokoban-seed*-seed0'; repeatable); "
                "the results still cover every finished run",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub at run time
    args = build_parser().parse_args(argv)
    # A job started in the background (`nohup ... &`) ignores Ctrl-C, and `kill` or a scheduler's SIGTERM would
    # stop Python without running any `finally` (a reproduction run's wall time): SIGTERM acts as Ctrl-C.
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        COMMANDS[args.command][1](args)
    except ConfigError as err:
        print(f"seed-vl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        terminated = isinstance(err, Terminated)
        print(f"seed-vl {args.command}: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if "torch" in sys.modules:  # only a command that imported torch can have joined a process group
            from seed_vl.distributed import leave_process_group

            leave_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
