"""The image-embedding cache: exact equality with the plain `pixel_values` forward, and encoder-call counts
over one update step (rollout, old policy, skill teacher, reference, student gradient pass)."""

from __future__ import annotations

import pytest
import torch
from helpers import noise_frame, user_context
from PIL import Image

from seed_vl.policy import Policy
from seed_vl.toy.tiny_model import build_tiny_model
from seed_vl.vision_cache import VisionCache, image_key

TOL = 1e-5


def _with_skill(context: list[dict]) -> list[dict]:
    skill = {
        "type": "text",
        "text": "**Episode-Level Skill**\n[Push the box from behind, never into a corner.]",
    }
    return [{"role": "user", "content": [skill, *context[0]["content"]]}]


def _responses(n: int, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(8, 600, (int(k),), generator=generator).tolist() for k in torch.randint(1, 9, (n,))]


def _assert_close(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), atol=TOL, rtol=0)


@pytest.fixture(scope="module")
def model_paths(tiny_vl_path, tmp_path_factory) -> dict[str, str]:
    paths = {"qwen2_5_vl": tiny_vl_path}
    for arch in ("qwen2_vl", "qwen3_vl"):
        paths[arch] = str(build_tiny_model(tmp_path_factory.mktemp(arch), arch=arch, seed=1))
    return paths


def test_image_key_hashes_content_and_settings():
    frame = noise_frame(0)
    assert image_key(frame, "s") == image_key(frame.copy(), "s")
    changed = frame.copy()
    changed.putpixel((5, 5), (0, 0, 0) if frame.getpixel((5, 5)) != (0, 0, 0) else (1, 1, 1))
    flat = Image.frombytes("RGB", (42, 168), frame.tobytes())  # same bytes, other size
    keys = {image_key(frame, "s"), image_key(changed, "s"), image_key(flat, "s"), image_key(frame, "t")}
    keys.add(image_key(frame.convert("RGBA").convert("RGB"), "s"))  # same pixels after a round trip
    assert len(keys) == 4
    gray = frame.convert("L")
    palette = Image.frombytes("P", gray.size, gray.tobytes())  # same bytes and size, other mode
    assert image_key(gray, "s") != image_key(palette, "s")


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen2_vl", "qwen3_vl"])
def test_cached_scores_equal_the_plain_forward(model_paths, arch):
    cached = Policy.from_pretrained(model_paths[arch], device="cpu")
    plain = Policy(cached.model, cached.processor, vision_cache_max_entries=0)
    a, b, c = noise_frame(1), noise_frame(2, 112), noise_frame(3, 56)
    contexts = [
        user_context("History and current frame.", a, b, c),
        [{"role": "user", "content": "A text-only sample in the same batch, longer than the others."}],
        user_context("Same frames, other order.", c, a),
        user_context("One repeated frame twice.", b, b),
        [{"role": "user", "content": "Text only."}],
        [{"role": "user", "content": "A micro-batch without any image."}],
    ]
    responses = _responses(len(contexts))
    first = cached.score(contexts, responses, micro_batch_size=4)
    second = cached.score(contexts, responses, micro_batch_size=3)  # all from the cache now
    reference = plain.score(contexts, responses, micro_batch_size=4)
    _assert_close(first.logprobs, reference.logprobs)
    _assert_close(first.entropies, reference.entropies)
    _assert_close(second.logprobs, reference.logprobs)
    assert cached.cache.stats() == {"images_seen": 14, "encoder_calls": 3, "hits": 11}
    assert plain.cache.stats() == {"images_seen": 7, "encoder_calls": 7, "hits": 0}
    # The features matter: a wrong frame would not go unnoticed at this tolerance.
    swapped = cached.score([user_context("History and current frame.", b, a, c)], responses[:1])
    assert (swapped.logprobs[0] - reference.logprobs[0]).abs().max() > 100 * TOL

    seeds = [1, 2, 3, 4, 5, 6]
    generated = cached.generate(contexts, max_new_tokens=6, seeds=seeds, stop_strings=())
    generated_plain = plain.generate(contexts, max_new_tokens=6, seeds=seeds, stop_strings=())
    assert [g.token_ids for g in generated] == [g.token_ids for g in generated_plain]


def test_one_update_step_encodes_each_unique_frame_once(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    reference = Policy.from_pretrained(tiny_vl_path, device="cpu", vision_cache=policy.cache)
    frame0, frame1 = noise_frame(10), noise_frame(11)
    ordinary = [
        user_context("step 0", frame0),
        user_context("step 1", frame0, frame1),
        user_context("step 2", frame1, frame0),
    ]
    paired = ordinary + [_with_skill(c) for c in ordinary]
    responses = _responses(3)

    policy.generate(ordinary, max_new_tokens=4, seeds=[0, 1, 2])  # rollout
    old_and_teacher = policy.score(paired, responses + responses, micro_batch_size=4)
    ref = reference.score(ordinary, responses, micro_batch_size=2)
    student = []
    for _, logprobs, _ in policy.score_batches(ordinary, responses, micro_batch_size=2, with_grad=True):
        torch.stack([lp.sum() for lp in logprobs]).sum().backward()
        student += logprobs

    frames_per_pass = 1 + 2 + 2
    seen = frames_per_pass * (1 + 2 + 1 + 1)  # rollout, old + teacher, reference, student
    assert policy.cache.stats() == {"images_seen": seen, "encoder_calls": 2, "hits": seen - 2}
    _assert_close(student, old_and_teacher.logprobs[:3])
    _assert_close(ref.logprobs, old_and_teacher.logprobs[:3])
    plain = Policy(policy.model, policy.processor, vision_cache_max_entries=0)
    _assert_close(old_and_teacher.logprobs, plain.score(paired, responses + responses).logprobs)

    policy.on_weights_updated()
    assert (
        policy.cache.stats() == {"images_seen": 0, "encoder_calls": 0, "hits": 0} and len(policy.cache) == 0
    )
    policy.score(ordinary, responses)
    assert policy.cache.stats()["encoder_calls"] == 2


def test_trainable_tower_shares_no_grad_encodings_and_encodes_the_gradient_pass(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu", freeze_vision_tower=False)
    tower = policy.model.model.visual
    assert all(p.requires_grad for p in tower.parameters())
    frame0, frame1 = noise_frame(20), noise_frame(21)
    ordinary = [user_context("a", frame0, frame1), user_context("b", frame1), user_context("c", frame0)]
    responses = _responses(3, seed=1)

    old_and_teacher = policy.score(ordinary + [_with_skill(c) for c in ordinary], responses + responses)
    assert policy.cache.stats()["encoder_calls"] == 2
    batches = list(policy.score_batches(ordinary, responses, micro_batch_size=3, with_grad=True))
    assert policy.cache.stats()["encoder_calls"] == 4 and len(policy.cache) == 2  # with grad, never stored
    student = batches[0][1]
    _assert_close(student, old_and_teacher.logprobs[:3])
    torch.stack([lp.sum() for lp in student]).sum().backward()
    assert (
        tower.patch_embed.proj.weight.grad is not None and tower.patch_embed.proj.weight.grad.abs().sum() > 0
    )


def test_stale_entries_are_dropped_when_the_weights_change(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    plain = Policy(policy.model, policy.processor, vision_cache_max_entries=0)
    contexts, responses = [user_context("a", noise_frame(30), noise_frame(31))], _responses(1, seed=2)
    before = policy.score(contexts, responses).logprobs
    with torch.no_grad():
        weight = policy.model.model.visual.patch_embed.proj.weight
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)) * weight.std())
    stale = policy.score(contexts, responses).logprobs
    _assert_close(stale, before)  # still the old features: this is why updates must clear the cache
    policy.on_weights_updated()
    fresh = policy.score(contexts, responses).logprobs
    _assert_close(fresh, plain.score(contexts, responses).logprobs)
    assert (fresh[0] - before[0]).abs().max() > 100 * TOL


def test_cache_is_bounded_least_recently_used_first(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu", vision_cache_max_entries=2)
    frames = [noise_frame(40 + i) for i in range(3)]
    responses = _responses(1)
    for frame in [frames[0], frames[1], frames[0], frames[2], frames[0], frames[1]]:
        policy.score([user_context("x", frame)], responses)
        assert len(policy.cache) <= 2
    # frame 1 was the least recently used when frame 2 arrived, so it is encoded twice; frame 0 once.
    assert policy.cache.stats() == {"images_seen": 6, "encoder_calls": 4, "hits": 2}


def test_negative_bound_is_a_clear_error():
    with pytest.raises(ValueError, match="vision_cache_max_entries must be >= 0"):
        VisionCache(max_entries=-1)


def test_a_context_goes_through_the_processor_once_and_scores_the_same(tiny_vl_path, monkeypatch):
    """The prompt-encoding cache: repeats of a context skip templating and processing; after a weight
    change only the images (not the whole processor) run again, for the vision encoder's misses."""
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    calls = {"prompts": 0, "images": 0}
    process = policy._process

    def counting_process(*args):
        calls["prompts"] += 1
        return process(*args)

    image_processor = type(policy.processor.image_processor)
    process_images = image_processor.__call__

    def counting_images(self, *args, **kwargs):
        calls["images"] += 1
        return process_images(self, *args, **kwargs)

    monkeypatch.setattr(policy, "_process", counting_process)
    contexts = [user_context("Two frames.", noise_frame(1), noise_frame(2)), user_context("No frame.")]
    responses = _responses(2)
    first = policy.score(contexts, responses).logprobs
    monkeypatch.setattr(image_processor, "__call__", counting_images)
    second = policy.score(contexts, responses).logprobs
    assert calls == {"prompts": 2, "images": 0}
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    _assert_close(second, Policy(policy.model, policy.processor).score(contexts, responses).logprobs)

    calls["images"] = 0  # (the fresh policy above processed its own)
    policy.on_weights_updated()  # the vision cache is emptied; the prompt encodings stay valid
    _assert_close(policy.score(contexts, responses).logprobs, second)
    assert calls == {"prompts": 2, "images": 2}  # one image-processor call per frame, nothing else
