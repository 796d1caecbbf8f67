"""The policy wrapper on the real tiny models: seeded generation, scoring against the plain HF forward,
text-only and vision-language models through the same calls."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import noise_frame, user_context
from PIL import Image

from seed_vl.policy import Policy

TOL = 1e-5


def _sokoban_context(text: str, *images: Image.Image) -> list[dict]:
    return user_context(text, *images, system="You are solving the Sokoban puzzle.")


def _text_context(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def _plain_logprobs(policy: Policy, context: list[dict], response: list[int]) -> torch.Tensor:
    """Reference: the model's own forward over the processor's own chat-template tokenization."""
    inputs = policy.processor.apply_chat_template(
        context, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    prompt_len = inputs["input_ids"].shape[1]
    inputs["input_ids"] = torch.cat([inputs["input_ids"], torch.tensor([response])], dim=1)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if "mm_token_type_ids" in inputs:
        inputs["mm_token_type_ids"] = torch.cat(
            [inputs["mm_token_type_ids"], torch.zeros((1, len(response)), dtype=torch.long)], dim=1
        )
    with torch.no_grad():
        logits = policy.model(**inputs).logits[0, prompt_len - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def test_properties(vl_policy, text_policy):
    assert vl_policy.is_vision and not text_policy.is_vision
    assert vl_policy.device == torch.device("cpu")
    assert vl_policy.tokenizer is vl_policy.processor.tokenizer
    assert text_policy.tokenizer is text_policy.processor
    assert not any(p.requires_grad for p in vl_policy.model.model.visual.parameters())  # frozen by default


@pytest.mark.parametrize("policy_name", ["vl_policy", "text_policy"])
def test_generate_is_seeded_per_sample(request, policy_name):
    policy: Policy = request.getfixturevalue(policy_name)
    frames = [noise_frame(1), noise_frame(2)] if policy.is_vision else []
    contexts = [
        _sokoban_context("Move the box.", *frames) if frames else _text_context("Move the box."),
        _text_context("Which way is the target?"),
        _text_context("go north"),
    ]
    first = policy.generate(contexts, max_new_tokens=8, seeds=[10, 11, 12], stop_strings=())
    again = policy.generate(contexts, max_new_tokens=8, seeds=[10, 11, 12], stop_strings=())
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert all(len(g.token_ids) == 8 and g.text == policy.tokenizer.decode(g.token_ids) for g in first)
    # Sample i depends on its own (context, seed) only: reorder and resize the batch.
    alone = policy.generate([contexts[0]], max_new_tokens=8, seeds=[10], stop_strings=())
    swapped = policy.generate([contexts[2], contexts[0]], max_new_tokens=8, seeds=[12, 10], stop_strings=())
    assert alone[0].token_ids == first[0].token_ids == swapped[1].token_ids
    assert swapped[0].token_ids == first[2].token_ids
    other_seed = policy.generate([contexts[0]], max_new_tokens=8, seeds=[99], stop_strings=())
    assert other_seed[0].token_ids != first[0].token_ids


def test_greedy_ignores_seeds_and_matches_hf_generate(vl_policy):
    context = _sokoban_context("Move the box.", noise_frame(3))
    a = vl_policy.generate([context], max_new_tokens=6, temperature=0.0, seeds=[1], stop_strings=())
    b = vl_policy.generate([context, _text_context("hi")], max_new_tokens=6, temperature=0.0, seeds=[2, 3])
    assert a[0].token_ids == b[0].token_ids[: len(a[0].token_ids)]
    inputs = vl_policy.processor.apply_chat_template(
        context, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = vl_policy.model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert a[0].token_ids == out[0, inputs["input_ids"].shape[1] :].tolist()


def test_top_p_keeps_only_the_nucleus(text_policy):
    context = [_text_context("Move the box.")]
    greedy = text_policy.generate(context, max_new_tokens=6, temperature=0.0, stop_strings=())[0].token_ids
    for seed in (1, 2):  # with a nucleus of one token, sampling is greedy whatever the seed
        nucleus = text_policy.generate(context, max_new_tokens=6, top_p=1e-6, seeds=[seed], stop_strings=())
        assert nucleus[0].token_ids == greedy


def test_generation_stops_right_after_the_stop_string(text_policy):
    context = [_text_context("Think, then act.")]
    full = text_policy.generate(context, max_new_tokens=12, seeds=[5], stop_strings=())[0]
    # A stop string that ends inside the 5th generated token's text.
    prefix = text_policy.tokenizer.decode(full.token_ids[:5])
    previous = text_policy.tokenizer.decode(full.token_ids[:4])
    stop = prefix[len(previous) - 2 : len(previous) + 1] if len(prefix) > len(previous) else prefix[-1:]
    assert stop and stop not in previous
    stopped = text_policy.generate(context, max_new_tokens=12, seeds=[5], stop_strings=[stop, "never-seen"])[
        0
    ]
    assert stopped.token_ids == full.token_ids[:5]
    assert stop in stopped.text


def test_generation_keeps_eos_as_a_token_but_not_in_the_text(tiny_text_path):
    policy = Policy.from_pretrained(tiny_text_path, device="cpu")
    with torch.no_grad():
        policy.model.model.norm.weight.zero_()  # all logits tie: greedy picks id 0, <|endoftext|>
    out = policy.generate([_text_context("hi")], max_new_tokens=5, temperature=0.0)
    assert out[0].token_ids == [0] and out[0].text == ""  # stopping is a trained choice


@pytest.mark.parametrize("policy_name", ["vl_policy", "text_policy"])
def test_score_matches_the_plain_forward(request, policy_name):
    policy: Policy = request.getfixturevalue(policy_name)
    frames = [noise_frame(4), noise_frame(5, 112), noise_frame(6, 56)]
    contexts = [
        _sokoban_context("Two frames.", frames[0], frames[1]) if policy.is_vision else _text_context("Two frames."),
        _text_context("A much longer text-only prompt about the box, the wall and the target. " * 3),
        _sokoban_context("One frame.", frames[2]) if policy.is_vision else _text_context("One frame."),
    ]
    generator = torch.Generator().manual_seed(0)
    responses = [torch.randint(8, 600, (n,), generator=generator).tolist() for n in (5, 1, 9)]
    scored = policy.score(contexts, responses, micro_batch_size=2)
    for context, response, logprobs, entropy in zip(
        contexts, responses, scored.logprobs, scored.entropies, strict=True
    ):
        assert logprobs.shape == entropy.shape == (len(response),)
        torch.testing.assert_close(logprobs, _plain_logprobs(policy, context, response), atol=TOL, rtol=0)
        assert (entropy > 0).all() and (
            entropy <= np.log(policy.model.config.get_text_config().vocab_size)
        ).all()
    # Micro-batching and padding do not change the numbers.
    one_by_one = policy.score(contexts, responses, micro_batch_size=1, return_entropy=False)
    assert one_by_one.entropies is None
    for a, b in zip(scored.logprobs, one_by_one.logprobs, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_score_batches_carry_gradients(text_policy):
    contexts = [_text_context("go north"), _text_context("take key"), _text_context("open door")]
    responses = [[20, 21, 22], [30], [40, 41]]
    batches = list(text_policy.score_batches(contexts, responses, micro_batch_size=2, with_grad=True))
    assert [indices for indices, _, _ in batches] == [[0, 1], [2]]
    indices, logprobs, entropies = batches[0]
    assert all(lp.requires_grad for lp in logprobs) and all(e.requires_grad for e in entropies)
    text_policy.model.zero_grad()
    torch.stack([lp.sum() for lp in logprobs]).sum().backward()
    assert text_policy.model.model.embed_tokens.weight.grad.abs().sum() > 0
    text_policy.model.zero_grad()
    assert not text_policy.score(contexts, responses).logprobs[0].requires_grad


def test_empty_response_scores_to_an_empty_tensor(text_policy):
    scored = text_policy.score([_text_context("hi"), _text_context("go")], [[], [25, 26]])
    assert scored.logprobs[0].shape == (0,) and scored.logprobs[1].shape == (2,)


def test_bad_inputs_are_clear_errors(vl_policy, text_policy, tmp_path):
    with pytest.raises(ValueError, match=r"contexts\[0\] holds an image but the model is text-only"):
        text_policy.generate([_sokoban_context("look", noise_frame(1))], max_new_tokens=2)
    with pytest.raises(ValueError, match=r"contexts\[1\]: an image item needs a PIL.Image"):
        vl_policy.score(
            [_text_context("a"), [{"role": "user", "content": [{"type": "image", "image": "frame.png"}]}]],
            [[300], [300]],
        )
    with pytest.raises(ValueError, match="responses: got 1 responses for 2 contexts"):
        text_policy.score([_text_context("a"), _text_context("b")], [[300]])
    image_pad = vl_policy.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with pytest.raises(ValueError, match=r"responses\[0\]: token id"):
        vl_policy.score([_text_context("a")], [[300, image_pad]])
    with pytest.raises(ValueError, match="seeds: got 1 seeds for 2 contexts"):
        text_policy.generate([_text_context("a"), _text_context("b")], max_new_tokens=2, seeds=[1])
    with pytest.raises(ValueError, match="model.path: .*no config.json"):
        Policy.from_pretrained(tmp_path / "missing")


def test_pixel_limits_reach_the_image_processor(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu", min_pixels=28 * 28, max_pixels=56 * 56)
    size = policy.processor.image_processor.size
    assert (size.shortest_edge, size.longest_edge) == (28 * 28, 56 * 56)
    out = policy.processor.image_processor(noise_frame(1, 112), return_tensors="pt")
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]  # 112x112 downscaled to 56x56


def test_scores_follow_the_sampling_temperature(text_policy):
    """At temperature T the scored distribution is softmax(logits / T): over the whole vocabulary, the
    probabilities at T = 2 are those at T = 1 raised to 1/2 and renormalised (what the sampler drew from)."""
    vocab = text_policy.model.get_input_embeddings().num_embeddings
    contexts = [[{"role": "user", "content": "push the box"}]] * vocab
    every_token = [[token] for token in range(vocab)]
    at = {t: torch.cat(text_policy.score(contexts, every_token, micro_batch_size=512, temperature=t,
                                         return_entropy=False).logprobs) for t in (1.0, 2.0)}
    assert torch.allclose(at[2.0].exp().sum(), torch.tensor(1.0), atol=1e-4)
    assert torch.allclose(at[2.0], torch.log_softmax(at[1.0] / 2.0, dim=0), atol=1e-4)
    assert not torch.allclose(at[2.0], at[1.0], atol=1e-2)
