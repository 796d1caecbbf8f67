"""GPU smoke check (DESIGN §5): GRPO and SEED steps at Qwen2.5-VL-3B shape, single process and FSDP2.

    python scripts/gpu_smoke.py [--out DIR]

On a machine with one GPU, nothing downloaded: builds a Qwen2.5-VL-3B-shaped model with random weights and
the tiny tokenizer, then runs on the same rollouts (visual Sokoban, 16 episodes x 3 turns)
  1. one GRPO step and one SEED step (self analyzer, KL reference) in one process, bf16 compute with
     float32 master weights, gradient checkpointing;
  2. one SEED step under FSDP2 (`accelerate launch --config_file configs/accelerate/fsdp.yaml`, one process);
and prints, per run, each phase's seconds, peak GPU memory, the fraction of trainable weights the update
changed, and the image-cache counters; `--out` also gets them as smoke.json. Under 5 minutes on one H200.
Without a GPU it exits 2 (`--device cpu --size tiny` is a dry run of the same code for development).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
SIZES = {  # Qwen2.5-VL-3B-Instruct's config.json, without its 151k-token embedding (the tokenizer is tiny)
    "3b": (
        dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
             num_key_value_heads=2, max_position_embeddings=128000),
        dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, window_size=112,
             fullatt_block_indexes=[7, 15, 23, 31]),
    ),
    "tiny": (None, None),
}
PHASES = ("rollout", "analysis", "scoring", "update")


def recipe(model: Path, out: Path, preset: str, device: str) -> list[str]:
    return [
        f"model.path={model}", "model.dtype=bfloat16", f"model.device={device}",
        "model.gradient_checkpointing=true",
        "env.name=sokoban_visual", "env.max_steps=3",
        "rollout.num_tasks=4", "rollout.group_size=4", "rollout.max_new_tokens=64",
        "analyzer.max_new_tokens=64", f"algorithm.preset={preset}",
        "train.lr=1e-6", "train.mini_batch_size=64", "train.micro_batch_size=8",
        f"train.output_dir={out}", f"train.run_name={preset}", "logging.progress=false",
    ]


def one_step(overrides: list[str], trajectories=None) -> tuple[dict, list]:
    """Build a trainer, run one update step (on `trajectories` when given) and measure it."""
    from seed_vl.config import load_config
    from seed_vl.trainer import Trainer

    trainer = Trainer(load_config(None, overrides))
    cuda = trainer.runtime.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    rollout_s = time.perf_counter()
    if trajectories is None:
        trajectories = trainer.rollout(1)
    rollout_s = time.perf_counter() - rollout_s
    before = {n: _local(p).clone() for n, p in trainer.policy.model.named_parameters() if p.requires_grad}
    metrics = trainer.learn(1, trajectories)
    changed = sum(int((_local(p) != before[n]).sum()) for n, p in trainer.policy.model.named_parameters()
                  if n in before)
    result = {
        "seconds": {"rollout": rollout_s, **{k: metrics[f"time/{k}"] for k in PHASES[1:]}},
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "trainable_changed": changed / sum(t.numel() for t in before.values()),
        "trainable_params": sum(t.numel() for t in before.values()) * trainer.runtime.num_processes,
        "cache": {k.removeprefix("cache/"): v for k, v in metrics.items() if k.startswith("cache/")},
        "loss": metrics["loss"],
        "distributed": str(trainer.runtime.accelerator.distributed_type).split(".")[-1]
        + (" (FSDP2)" if trainer.runtime.is_fsdp else ""),
    }
    del trainer
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return result, trajectories


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.detach().to_local() if hasattr(param, "to_local") else param.detach()


def show(name: str, result: dict) -> None:
    seconds = "  ".join(f"{k} {v:.1f}s" for k, v in result["seconds"].items())
    peak = f"{result['peak_gib']:.1f} GiB" if result["peak_gib"] is not None else "n/a"
    cache = ", ".join(f"{k} {int(v)}" for k, v in sorted(result["cache"].items()))
    print(f"{name:<14} {result['distributed']}: {seconds}\n{'':<14} peak memory {peak}; "
          f"trainable weights changed {100 * result['trainable_changed']:.2f}% of "
          f"{result['trainable_params'] / 1e9:.2f}B; image cache: {cache}; loss {result['loss']:.4f}", flush=True)


def fsdp_launch(model: Path, out: Path, device: str) -> dict:
    """The FSDP2 step in a child process started by `accelerate launch`."""
    config = REPO / "configs/accelerate/fsdp.yaml"
    if device == "cpu":  # dry run: accelerate runs FSDP only on GPUs; gloo stands in (see seed_vl.distributed)
        config = out / "cpu_fsdp.yaml"
        text = (REPO / "configs/accelerate/fsdp.yaml").read_text()
        config.write_text(text.replace("use_cpu: false", "use_cpu: true"))
    result_file = out / "fsdp.json"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
               "--num_processes", "1", "--main_process_port", "29561", __file__,
               "--fsdp-step", "--model", str(model), "--out", str(out), "--device", device]
    subprocess.run(command, check=True)
    return json.loads(result_file.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="working directory (model, runs, smoke.json); default: a temporary one")
    parser.add_argument("--size", choices=SIZES, default="3b")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--fsdp-step", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_smoke: no CUDA GPU here (this check needs one; `--device cpu --size tiny` is a dry run)",
              file=sys.stderr)
        return 2
    out = Path(args.out or tempfile.mkdtemp(prefix="seed-vl-smoke-"))
    out.mkdir(parents=True, exist_ok=True)

    if args.fsdp_step:
        result, _ = one_step([*recipe(Path(args.model), out / "runs", "seed", args.device), "train.run_name=fsdp2"])
        (out / "fsdp.json").write_text(json.dumps(result))
        return 0

    from seed_vl.toy.tiny_model import build_tiny_model

    start = time.perf_counter()
    model = out / f"qwen2_5_vl_{args.size}"
    if not (model / "config.json").is_file():
        text_dims, vision_dims = SIZES[args.size]
        build_tiny_model(model, text_dims=text_dims, vision_dims=vision_dims, device=args.device,
                         dtype=torch.bfloat16)
    print(f"model {model}: built in {time.perf_counter() - start:.1f}s"
          + (f" on {torch.cuda.get_device_name()}" if args.device == "cuda" else ""), flush=True)

    results = {}
    results["grpo"], trajectories = one_step(recipe(model, out / "runs", "grpo", args.device))
    show("grpo", results["grpo"])
    results["seed"], _ = one_step(recipe(model, out / "runs", "seed", args.device), trajectories)
    results["seed"]["seconds"]["rollout"] = results["grpo"]["seconds"]["rollout"]  # the same rollouts
    show("seed", results["seed"])
    results["seed_fsdp2"] = fsdp_launch(model, out, args.device)
    show("seed, FSDP2", results["seed_fsdp2"])
    results["total_seconds"] = time.perf_counter() - start
    (out / "smoke.json").write_text(json.dumps(results, indent=1))
    print(f"total {results['total_seconds']:.0f}s; results in {out / 'smoke.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
