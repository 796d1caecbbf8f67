"""Generation backends. One contract, run against the `hf` backend (transformers' generate on the tiny
models) and the `vllm` backend over a recording fake engine (tests/fake_vllm.py; vLLM cannot run here):
placeholders, prompt ids, seeds, stop cuts and the sampler's log-probs. Then what only the vLLM backend
does: weight pushes (once per update step, under checkpoint names, LoRA merged, FSDP2 shards gathered),
cache resets, sleep/wake; the trainer end to end with `generation.backend=vllm`; the off-policy guard."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from dataclasses import fields
from pathlib import Path

import fake_vllm
import pytest
import torch
from helpers import noise_frame, user_context
from safetensors import safe_open
from test_distributed import _cpu_variant
from test_trainer import _cli, _metrics, _overrides

from seed_vl.config import (
    AlgorithmConfig,
    ConfigError,
    GenerationConfig,
    LoraConfig,
    ModelConfig,
    load_config,
)
from seed_vl.generation import HFBackend, VLLMBackend, collapse_placeholders
from seed_vl.losses import policy_loss
from seed_vl.policy import Policy
from seed_vl.trainer import Trainer

BACKENDS = ["hf", "vllm"]


@pytest.fixture(scope="module")
def fake_engine_module():
    with pytest.MonkeyPatch.context() as patch:
        yield fake_vllm.install(patch)


def _policy(path: str, backend: str, **model) -> Policy:
    return Policy.from_config(
        ModelConfig(path=path, device="cpu", **model), generation=GenerationConfig(backend=backend)
    )


@pytest.fixture(scope="module", params=BACKENDS)
def vl_policy(request, tiny_vl_path, fake_engine_module) -> Policy:
    return _policy(tiny_vl_path, request.param)


@pytest.fixture(scope="module", params=BACKENDS)
def text_policy(request, tiny_text_path, fake_engine_module) -> Policy:
    return _policy(tiny_text_path, request.param)


def _contexts(policy: Policy) -> list[list[dict]]:
    frames = [noise_frame(1), noise_frame(2, 56)] if policy.is_vision else []
    first = user_context("Move the box.", *frames) if frames else [{"role": "user", "content": "Move the box."}]
    second = user_context("Which way?", noise_frame(1)) if frames else [{"role": "user", "content": "go north"}]
    return [first, second, [{"role": "user", "content": "<think>"}]]


def _engine(policy: Policy):
    backend = policy.generation_backend
    return backend.engine if isinstance(backend, VLLMBackend) else None


# --------------------------------------------------------------------------------------------- contract
def test_the_backend_is_the_one_configured(vl_policy):
    backend = vl_policy.generation_backend
    assert isinstance(backend, HFBackend if backend.name == "hf" else VLLMBackend)


def test_prompt_ids_and_placeholders_are_the_processors(vl_policy):
    contexts = _contexts(vl_policy)
    prompts, _, _ = vl_policy._encode_contexts(contexts)
    pad = vl_policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    start = vl_policy.tokenizer.convert_tokens_to_ids("<|vision_start|>")
    merge = vl_policy.processor.image_processor.merge_size ** 2
    for prompt, images in zip(prompts, [2, 1, 0], strict=True):
        collapsed = collapse_placeholders(prompt.input_ids, pad)
        assert prompt.input_ids.count(start) == collapsed.count(pad) == images == len(prompt.image_keys)
        expected = sum(int(g.prod()) // merge for g in prompt.image_grid_thw) if images else 0
        assert prompt.input_ids.count(pad) == expected
    generations = vl_policy.generate(contexts, max_new_tokens=4, seeds=[1, 2, 3], stop_strings=())
    assert len(generations) == 3
    engine = _engine(vl_policy)
    if engine is not None:  # what the engine ran: our ids, its uuids our content keys
        assert [out.prompt_token_ids for out in engine.last_outputs] == [p.input_ids for p in prompts]
        assert engine.events[-1][1] == [{"image": list(p.image_keys)} if p.image_keys else {} for p in prompts]


def test_prompt_ids_expanded_twice_are_refused(vl_policy):
    engine = _engine(vl_policy)
    if engine is None:
        pytest.skip("the hf backend runs the processor's ids as they are")
    (prompt,), _, _ = vl_policy._encode_contexts([_contexts(vl_policy)[1]])
    with pytest.raises(RuntimeError, match="prompt updates"):  # expanded ids given: vLLM expands again
        engine.generate([{"prompt_token_ids": prompt.input_ids, "multi_modal_data": {"image": [noise_frame(1)]}}],
                        fake_vllm.SamplingParams(max_tokens=2))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_same_seeds_same_outputs_and_samples_are_independent_of_the_batch(text_policy, temperature):
    contexts = _contexts(text_policy)
    kwargs = {"max_new_tokens": 8, "temperature": temperature, "stop_strings": ()}
    first = text_policy.generate(contexts, seeds=[10, 11, 12], **kwargs)
    again = text_policy.generate(contexts, seeds=[10, 11, 12], **kwargs)
    assert [(g.token_ids, g.logprobs, g.text) for g in first] == [(g.token_ids, g.logprobs, g.text) for g in again]
    swapped = text_policy.generate([contexts[2], contexts[0]], seeds=[12, 10], **kwargs)
    assert swapped[1].token_ids == first[0].token_ids and swapped[0].token_ids == first[2].token_ids
    assert text_policy.generate([contexts[0]], seeds=[99], **kwargs)[0].token_ids != first[0].token_ids


def test_the_cut_is_the_same_at_stop_strings(text_policy):
    context = [_contexts(text_policy)[0]]
    full = text_policy.generate(context, max_new_tokens=12, seeds=[5], stop_strings=())[0]
    stop = text_policy.tokenizer.decode(full.token_ids[:5])[-1]
    previous = text_policy.tokenizer.decode(full.token_ids[:4])
    cut = next(k for k in range(1, 13) if stop in text_policy.tokenizer.decode(full.token_ids[:k]))
    assert cut <= 5 or stop in previous
    stopped = text_policy.generate(context, max_new_tokens=12, seeds=[5], stop_strings=[stop])[0]
    assert stopped.token_ids == full.token_ids[:cut]
    assert stopped.text == text_policy.tokenizer.decode(full.token_ids[:cut])
    assert stopped.logprobs == pytest.approx(full.logprobs[:cut])


@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
def test_sampler_logprobs_match_the_trainers_scores(text_policy, vl_policy, temperature):
    """The gap the trainer logs is ~0 on fp32 CPU. VL: the placeholders a response may never hold are
    banned by the sampler and not by the scorer: the gap is their (tiny) probability mass."""
    for policy, tolerance in ((text_policy, 1e-4), (vl_policy, 5e-3)):
        contexts = _contexts(policy)
        generations = policy.generate(contexts, max_new_tokens=10, temperature=temperature, seeds=[1, 2, 3],
                                      stop_strings=())
        scores = policy.score(contexts, [g.token_ids for g in generations], temperature=temperature,
                              return_entropy=False).logprobs
        for generation, score in zip(generations, scores, strict=True):
            assert len(generation.logprobs) == len(generation.token_ids) == len(score)
            assert torch.allclose(torch.tensor(generation.logprobs), score, atol=tolerance)


# ------------------------------------------------------------------------------------- weight pushes
def _saved_keys(policy: Policy, out: Path, merged: bool = False) -> dict[str, tuple[int, ...]]:
    (policy.save_merged if merged else policy.save_pretrained)(out)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


def test_weights_are_pushed_once_per_update_by_checkpoint_name_then_caches_reset(tmp_path, tiny_vl_path,
                                                                              fake_engine_module):
    policy = _policy(tiny_vl_path, "vllm")
    contexts = _contexts(policy)
    before = policy.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3], stop_strings=())
    engine = _engine(policy)
    policy.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3], stop_strings=())
    assert engine.count("load_weights") == 1  # the first generation, then nothing changed
    (_, shapes), = [e for e in engine.events if e[0] == "load_weights"]
    assert shapes == _saved_keys(policy, tmp_path / "saved")

    with torch.no_grad():  # an update step
        policy.model.lm_head.weight.mul_(3.0)
    policy.on_weights_updated()
    after = policy.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3], stop_strings=())
    policy.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3], stop_strings=())
    assert engine.count("load_weights") == 2 and policy.generation_backend.pushes == 2
    kinds = [e[0] for e in engine.events]
    for k, kind in enumerate(kinds):
        if kind == "load_weights":
            assert kinds[k + 1 : k + 3] == ["reset_prefix_cache", "reset_encoder_cache"]
    assert [g.logprobs for g in after] != [g.logprobs for g in before]
    scores = policy.score(contexts, [g.token_ids for g in after], return_entropy=False).logprobs
    for generation, score in zip(after, scores, strict=True):  # the engine samples with the new weights
        assert torch.allclose(torch.tensor(generation.logprobs), score, atol=5e-3)


def test_sleep_frees_the_engine_and_generation_wakes_it_weights_first(tiny_text_path, fake_engine_module):
    policy = _policy(tiny_text_path, "vllm")
    context = [[{"role": "user", "content": "hi"}]]
    policy.generate(context, max_new_tokens=2, seeds=[1])
    engine = _engine(policy)
    policy.generation_backend.sleep()
    policy.on_weights_updated()
    assert engine.asleep == {"weights", "kv_cache"}
    policy.generate(context, max_new_tokens=2, seeds=[1])
    tail = [e[0] if e[0] != "wake_up" else e for e in engine.events[engine.events.index(("sleep", 1)) :]]
    assert tail == ["sleep", ("wake_up", ("weights",)), "load_weights", ("wake_up", ("kv_cache",)),
                    "reset_prefix_cache", "reset_encoder_cache", "generate"]
    assert engine.init_kwargs["enable_sleep_mode"] and engine.init_kwargs["logprobs_mode"] == "processed_logprobs"


def test_lora_is_merged_for_the_push_and_unmerged_after(tmp_path, tiny_vl_path, fake_engine_module):
    policy = _policy(tiny_vl_path, "vllm", lora=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # adapters that change the model
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.5)
    context = [_contexts(policy)[1]]
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    generation = policy.generate(context, max_new_tokens=6, seeds=[4])[0]
    engine = _engine(policy)
    for name, param in policy.model.named_parameters():  # unmerged: the trained weights are untouched
        assert torch.equal(param, before[name]), name
    assert not any(getattr(m, "merged", False) for m in policy.model.modules())
    score = policy.score(context, [generation.token_ids], return_entropy=False).logprobs[0]
    assert torch.allclose(torch.tensor(generation.logprobs), score, atol=5e-3)  # the engine runs the adapted model
    (_, shapes), = [e for e in engine.events if e[0] == "load_weights"]
    assert shapes == _saved_keys(policy, tmp_path / "merged", merged=True)  # (merge_and_unload: last)


def test_fsdp2_pushes_full_tensors(tmp_path, tiny_text_path):
    """Two CPU processes under FSDP2: the pushed weights are whole, inside and outside `full_weights`."""
    import os
    import subprocess

    script = Path(__file__).with_name("fsdp_push.py")
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(_cpu_variant("fsdp.yaml", tmp_path, 2)), "--main_process_port", "29581", str(script), tiny_text_path]
    repo = str(script.parents[1])  # this checkout's seed_vl, whichever one is installed
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": repo}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("full weights pushed") == 2, proc.stdout


# ------------------------------------------------------------------------------------------ trainer
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_trainer_runs_end_to_end_and_logs_the_logprob_gap(tmp_path, tiny_vl_path, fake_engine_module, backend):
    cfg = load_config(None, _overrides(tiny_vl_path, tmp_path, "sokoban_visual", **{
        "generation.backend": backend, "train.steps": 2, "algorithm.rollout_is_cap": 2.0, "eval.num_tasks": 1,
        "rollout.group_size": 2, "rollout.num_tasks": 1,
    }))
    trainer = Trainer(cfg)
    trainer.train()
    last = _metrics(tmp_path / "run")[-1]
    assert 0.0 <= last["rollout/logprob_gap_mean"] <= last["rollout/logprob_gap_max"] < 0.05
    assert 0.9 < last["rollout_is_weight"] <= 2.0
    record = json.loads((tmp_path / "run" / "trajectories" / "step_000002" / "trajectories.jsonl").read_text()
                        .splitlines()[0])
    assert all(len(t["rollout_logprobs"]) == len(t["response_ids"]) for t in record["turns"])
    if backend == "vllm":
        engine = _engine(trainer.policy)
        # Pushes: before the first evaluation, after update 1 (step 2's rollout), after update 2 (final eval).
        assert trainer.policy.generation_backend.pushes == engine.count("load_weights") == 3
        assert engine.count("reset_prefix_cache") == engine.count("reset_encoder_cache") == 3
        assert engine.count("sleep") == 2  # once per step, before scoring and the update


def test_rollout_importance_weights_are_truncated_ratios():
    torch.manual_seed(0)
    logprobs = torch.randn(2, 4, requires_grad=True)
    old = logprobs.detach() + 0.1 * torch.randn(2, 4)
    rollout = old + torch.tensor([[0.0, 1.0, -1.0, 0.5], [2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[True] * 4, [True, True, False, False]])
    adv = torch.tensor([1.0, -0.5])
    base = AlgorithmConfig(preset="grpo")
    plain, _ = policy_loss(logprobs, old, adv, mask, base, rollout_logprobs=rollout)  # off: ignored
    same, stats = policy_loss(logprobs, old, adv, mask, base.model_copy(update={"rollout_is_cap": 2.0}),
                              rollout_logprobs=old)
    assert torch.allclose(plain, same) and stats["rollout_is_weight"] == pytest.approx(1.0)
    loss, stats = policy_loss(logprobs, old, adv, mask, base.model_copy(update={"rollout_is_cap": 2.0}),
                              rollout_logprobs=rollout)
    weights = torch.exp(old - rollout).clamp(max=2.0)
    assert stats["rollout_is_weight"] == pytest.approx(float(weights[mask].mean()), rel=1e-5)
    assert stats["rollout_is_capped_frac"] == pytest.approx(1 / 6)
    assert not torch.allclose(loss, plain)


# -------------------------------------------------------------------------------- config and errors
def test_generation_settings_are_checked_by_name():
    with pytest.raises(ConfigError, match="generation.backend"):
        load_config(None, ["generation.backend=sglang"])
    with pytest.raises(ConfigError, match="generation.gpu_memory_utilization"):
        load_config(None, ["generation.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match="generation.image_embeds"):
        load_config(None, ["generation.image_embeds=true", "model.freeze_vision_tower=false"])
    with pytest.raises(ConfigError, match="algorithm.rollout_is_cap"):
        load_config(None, ["algorithm.rollout_is_cap=0"])
    assert load_config(None, []).generation.backend == "hf"


def test_cached_image_features_reach_the_engine(tiny_vl_path, fake_engine_module):
    pixels = _policy(tiny_vl_path, "vllm")
    embeds = Policy.from_config(ModelConfig(path=tiny_vl_path, device="cpu"),
                                generation=GenerationConfig(backend="vllm", image_embeds=True))
    contexts = _contexts(pixels)
    a = pixels.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3])
    b = embeds.generate(contexts, max_new_tokens=6, seeds=[1, 2, 3])
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert _engine(embeds).init_kwargs["enable_mm_embeds"] is True


def test_a_missing_vllm_is_one_line_exit_2(monkeypatch, tiny_text_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` fails as when the extra is missing
    with pytest.raises(ConfigError, match=r"generation.backend: vllm is not installed"):
        _policy(tiny_text_path, "vllm")
    if importlib.util.find_spec("vllm") is None:
        proc = _cli("eval", f"model.path={tiny_text_path}", "model.device=cpu", "env.name=ezpoints_text",
                    "generation.backend=vllm", "eval.num_tasks=1")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "generation.backend" in proc.stderr


# ------------------------------------------------------------------------------- the fake's surface
def _real_vllm(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm", raising=False)
    try:
        return importlib.import_module("vllm")
    except ImportError as err:
        pytest.skip(f"vllm is not importable here ({err}): the fake's signatures are compared on a machine with it")


def _parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_fake_engine_has_the_pinned_vllms_signatures(monkeypatch):
    vllm = _real_vllm(monkeypatch)
    assert vllm.__version__ == fake_vllm.__version__
    from vllm.engine.arg_utils import EngineArgs
    from vllm.logprobs import Logprob
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.llm_engine import LLMEngine

    for name in ("__init__", "generate", "apply_model", "reset_prefix_cache", "sleep", "wake_up"):
        assert _parameters(getattr(fake_vllm.LLM, name)) == _parameters(getattr(vllm.LLM, name)), name
    assert _parameters(fake_vllm.LLMEngine.reset_encoder_cache) == _parameters(LLMEngine.reset_encoder_cache)
    assert _parameters(fake_vllm.RequestOutput.__init__) == _parameters(RequestOutput.__init__)
    for fake, real in ((fake_vllm.CompletionOutput, CompletionOutput), (fake_vllm.Logprob, Logprob)):
        assert [f.name for f in fields(fake)] == [f.name for f in fields(real)]
    real_params = inspect.signature(vllm.SamplingParams).parameters
    for f in fields(fake_vllm.SamplingParams):
        assert f.name in real_params and real_params[f.name].default == f.default, f.name
    # The engine options the backend passes through LLM(**kwargs) are EngineArgs fields.
    engine_fields = {f.name for f in fields(EngineArgs)}
    for option in ("enable_sleep_mode", "max_model_len", "limit_mm_per_prompt", "enable_mm_embeds",
                   "logprobs_mode", "enable_prefix_caching", "generation_config", "distributed_executor_backend"):
        assert option in engine_fields, option


def test_the_smoke_script_runs_against_the_fake_engine(tiny_vl_path, fake_engine_module, capsys, script_module):
    """scripts/smoke_vllm.py is for a GPU with a real vLLM; here its code paths run on the fake."""
    smoke = script_module("smoke_vllm")
    status = smoke.main(["--model", tiny_vl_path, "--dtype", "float32", "--batch", "4", "--max-new-tokens", "8",
                         "--image-size", "56"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert out.count("PASS") == 3 and "tokens/s" in out
