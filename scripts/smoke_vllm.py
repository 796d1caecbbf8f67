"""The vLLM generation backend on a real engine: for a machine with a GPU, the `vllm` extra (vllm==0.33.0)
and a real Qwen2.5-VL (or text) checkpoint. Never run in the test suite (nothing here ran yet: no session had
vLLM). Checks, each printed as one line, exit status 1 if any fails:

1. seeds reproduce: the same requests with the same seeds give the same tokens and log-probs;
2. weight sync: perturbing one weight of the training model, marking the weights updated and generating
   again changes the engine's log-probs (and restoring it restores them);
3. the HF-vs-vLLM log-prob gap on the same tokens: vLLM's sampler log-probs against the trainer's scores;
4. rollout speed: generated tokens per second of the vllm and hf backends on the same batch.

    python scripts/smoke_vllm.py --model /path/to/Qwen2.5-VL-3B-Instruct [--batch 32 --max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from PIL import Image

from seed_vl.config import GenerationConfig, ModelConfig
from seed_vl.generation import HFBackend
from seed_vl.policy import Policy


def _frame(seed: int, size: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _contexts(policy: Policy, batch: int, image_size: int) -> list[list[dict]]:
    """Multi-turn-like contexts: every other one shows two frames, frames repeat across the batch (as in a
    group), so the engine's caches keyed by our image keys get hits."""
    contexts = []
    for i in range(batch):
        text = {"type": "text", "text": f"Episode {i}. Think, then answer with <action>up|down|left|right</action>."}
        frames = [_frame(i % 4, image_size), _frame(100 + i % 2, image_size)][: 1 + i % 2] if policy.is_vision else []
        content = [{"type": "image", "image": f} for f in frames] + [text]
        contexts.append([{"role": "system", "content": "You are playing Sokoban."}, {"role": "user", "content": content}])
    return contexts


def _generate(policy: Policy, contexts, args, seeds):
    return policy.generate(contexts, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           stop_strings=("</action>",), seeds=seeds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a local Hugging Face checkpoint directory")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=32, help="requests per generate call")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--image-size", type=int, default=336)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--image-embeds", action="store_true", help="send cached image features, not pixels")
    parser.add_argument("--gap-tolerance", type=float, default=0.05, help="largest mean |l_hf - l_vllm| accepted")
    args = parser.parse_args(argv)

    generation = GenerationConfig(backend="vllm", gpu_memory_utilization=args.gpu_memory_utilization,
                                  max_model_len=args.max_model_len, image_embeds=args.image_embeds)
    policy = Policy.from_config(ModelConfig(path=args.model, dtype=args.dtype), generation=generation)
    vllm_backend, hf_backend = policy.generation_backend, HFBackend(policy)
    contexts = _contexts(policy, args.batch, args.image_size)
    seeds = list(range(1000, 1000 + args.batch))
    failures = []

    def check(name: str, ok: bool, detail: str) -> None:
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    _generate(policy, contexts[:2], args, seeds[:2])  # engine start, first weight push, warm-up
    start = time.perf_counter()
    first = _generate(policy, contexts, args, seeds)
    vllm_seconds = time.perf_counter() - start
    again = _generate(policy, contexts, args, seeds)
    same = [g.token_ids for g in first] == [g.token_ids for g in again]
    lp_diff = max(max((abs(a - b) for a, b in zip(x.logprobs, y.logprobs, strict=True)), default=0.0)
                  for x, y in zip(first, again, strict=True))
    check("seeds reproduce", same and lp_diff < 1e-3, f"tokens equal: {same}, largest log-prob change {lp_diff:.2e}")

    # 3. The gap on the same tokens: vLLM's sampler against the trainer's own scoring.
    scores = policy.score(contexts, [g.token_ids for g in first], micro_batch_size=8, return_entropy=False,
                          temperature=args.temperature).logprobs
    gaps = torch.cat([(torch.tensor(g.logprobs) - s.float().cpu()).abs() for g, s in zip(first, scores, strict=True)
                      if g.token_ids])
    check("hf-vs-vllm log-prob gap", float(gaps.mean()) < args.gap_tolerance,
          f"mean {float(gaps.mean()):.4f}, max {float(gaps.max()):.4f} over {len(gaps)} tokens")

    # 2. Weight sync: perturb the LM head, push, regenerate; restore and push again.
    head = policy.model.get_output_embeddings().weight
    saved = head.detach().clone()
    with torch.no_grad():
        head.mul_(1.5)
    policy.on_weights_updated()
    perturbed = _generate(policy, contexts[:4], args, seeds[:4])
    changed = any(a.logprobs != b.logprobs for a, b in zip(first[:4], perturbed, strict=True))
    with torch.no_grad():
        head.copy_(saved)
    policy.on_weights_updated()
    restored = _generate(policy, contexts[:4], args, seeds[:4])
    back = [g.token_ids for g in restored] == [g.token_ids for g in first[:4]]
    check("weight sync", changed and back,
          f"log-probs changed after the push: {changed}; restored weights give the first tokens: {back}; "
          f"pushes so far {vllm_backend.pushes}")

    # 4. Speed: the same batch through the hf backend.
    policy.generation_backend.sleep()  # give the GPU back to transformers' generate
    policy.generation_backend = hf_backend
    start = time.perf_counter()
    hf = _generate(policy, contexts, args, seeds)
    hf_seconds = time.perf_counter() - start
    vllm_tokens, hf_tokens = sum(len(g.token_ids) for g in first), sum(len(g.token_ids) for g in hf)
    print(f"INFO rollout speed: vllm {vllm_tokens / vllm_seconds:.0f} tokens/s ({vllm_seconds:.2f} s), "
          f"hf {hf_tokens / hf_seconds:.0f} tokens/s ({hf_seconds:.2f} s), batch {args.batch} x "
          f"{args.max_new_tokens} new tokens", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
