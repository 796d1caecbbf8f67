"""The tiny model builder: HF format, Qwen architectures, a tokenizer fitted to our text, same seed same bytes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from seed_vl.processors.prompts import ANSWER_INSTRUCTION
from seed_vl.toy.tiny_model import (
    _MODEL_CLASSES,
    ARCHITECTURES,
    SPECIAL_TOKENS,
    build_tiny_model,
    tiny_config,
)


def _file_hashes(directory: str | Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(Path(directory).iterdir())}


def _image_message(*images: Image.Image) -> list[dict]:
    content = [{"type": "image", "image": image} for image in images]
    return [
        {"role": "user", "content": [*content, {"type": "text", "text": "Push the box onto the target."}]}
    ]


def test_vl_model_loads_like_a_qwen_checkpoint(tiny_vl_path):
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_path)
    processor = AutoProcessor.from_pretrained(tiny_vl_path)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert type(processor).__name__ == "Qwen2_5_VLProcessor"
    assert type(processor.image_processor).__name__ == "Qwen2VLImageProcessor"
    assert 1_000_000 < model.num_parameters() < 10_000_000

    frames = [Image.new("RGB", (96, 96), "green"), Image.new("RGB", (300, 300), "white")]
    text = processor.apply_chat_template(_image_message(*frames), tokenize=False, add_generation_prompt=True)
    assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 2
    assert text.endswith("<|im_start|>assistant\n")
    inputs = processor(text=[text], images=frames, return_tensors="pt")
    # 96x96 -> 84x84 -> 6x6 patches -> 3x3 merged tokens; 300x300 -> 308x308 -> 11x11 merged tokens
    assert inputs["image_grid_thw"].tolist() == [[1, 6, 6], [1, 22, 22]]
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == 9 + 121
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()


def test_text_model_loads_like_a_qwen_checkpoint(tiny_text_path, tiny_vl_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_text_path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_text_path)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "go north"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\ngo north<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert model(ids).logits.shape[-1] == model.config.vocab_size
    # Each variant's tokenizer is the one it was trained with, after loading (transformers imposes Qwen2's
    # pre-tokenizer on a qwen2 checkpoint, so the text variant is trained word-level).
    assert _file_hashes(tiny_text_path)["tokenizer.json"] != _file_hashes(tiny_vl_path)["tokenizer.json"]


@pytest.mark.parametrize("variant", ["text", "vl"])
def test_tokenizer_is_fitted_to_the_project_text(tiny_text_path, tiny_vl_path, variant):
    if variant == "text":
        tokenizer = AutoTokenizer.from_pretrained(tiny_text_path)
    else:
        tokenizer = AutoProcessor.from_pretrained(tiny_vl_path).tokenizer
    assert 2000 <= len(tokenizer) <= 6144
    for token in SPECIAL_TOKENS:
        assert tokenizer.convert_ids_to_tokens(tokenizer.convert_tokens_to_ids(token)) == token
        assert len(tokenizer(token)["input_ids"]) == 1
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    # Environment and analyzer words are single tokens; anything else still round-trips through bytes.
    words = [" Sokoban", " left", " box", " target", " formula", " north", " skill", " avoid"]
    if variant == "vl":  # phrase level: frequent words and clauses, not every word after a space
        words = ["Sokoban", " box", "formula", "skill", "up", "down", "left", "right"]
    for word in words:
        assert len(tokenizer(word)["input_ids"]) == 1, word
    for text in [
        "<think>push</think><action>left</action>",
        "# _ O X P √ S",
        "12 = 3 * 4",
        "zebra ünïcode 😀",
    ]:
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    # The answer tags and the move inside them are tokens of their own (gate statistics read move tokens).
    pieces = [tokenizer.decode([t]) for t in tokenizer("<think>I push it.</think><action>left</action>")["input_ids"]]
    assert pieces[-3:] == ["<action>", "left", "</action>"] or variant == "text"
    if variant == "vl":  # phrase level: a recurring prompt clause is a token; a move is its own token everywhere
        assert len(tokenizer(ANSWER_INSTRUCTION)["input_ids"]) <= 8
        for text, move in [("Admissible actions: up, down, left, right", "right"), ("step 3 left, step 4 up", "left"),
                           ("Step 2: you took 'down'; reward -0.1.", "down"), ("enter 6 * 2 and then '='", "*")]:
            assert move in [tokenizer.decode([t]) for t in tokenizer(text)["input_ids"]], text
        assert len(tokenizer("Admissible actions: up, down, left, right")["input_ids"]) == 8


@pytest.mark.parametrize(
    "arch, model_class, processor_class",
    [
        ("qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor"),
        ("qwen3_vl", "Qwen3VLForConditionalGeneration", "Qwen3VLProcessor"),
    ],
)
def test_other_vl_architectures_load(tmp_path, arch, model_class, processor_class):
    build_tiny_model(tmp_path / arch, arch=arch)
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / arch)
    processor = AutoProcessor.from_pretrained(tmp_path / arch)
    assert (type(model).__name__, type(processor).__name__) == (model_class, processor_class)
    frame = Image.new("RGB", (112, 112), "blue")
    text = processor.apply_chat_template(_image_message(frame), tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[text], images=[frame], return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_rotary_positions_tell_neighbouring_cells_apart(tiny_vl_path, arch):
    """Some rotary frequency of the decoder turns at least 0.1 rad per merged patch along each image axis:
    otherwise the decoder cannot tell a box left of the player from one right of it (Qwen2.5-VL's contiguous
    split at theta 1e4 gives width at most 0.003 rad)."""
    config = tiny_config(arch, AutoProcessor.from_pretrained(tiny_vl_path).tokenizer)
    model = _MODEL_CLASSES[arch][1](config)
    rotary = model.model.language_model.rotary_emb
    x = torch.zeros(1, dtype=torch.float32)
    for axis in (1, 2):  # height, width; time stays 0
        positions = torch.zeros(3, 1, 2, dtype=torch.long)
        positions[axis, 0, 1] = 1  # the neighbouring cell
        cos, sin = rotary(x, positions)
        turn = torch.atan2(sin[0, 1], cos[0, 1]).abs()  # position 0 is angle 0; a wrapped turn reads small
        assert turn.max() >= 0.1, (arch, axis, turn.max())


def test_rope_probe_trains_fresh_weights_under_a_given_layout(tiny_vl_path, capsys, script_module):
    probe = script_module("rope_probe")
    small = ["--model", tiny_vl_path, "--steps", "1", "--train-rooms", "32", "--held-out", "8"]
    assert probe.main([*small, "--section", "4,6,6"]) == 0
    out = capsys.readouterr().out
    assert "'mrope_section': [4, 6, 6]" in out and re.findall(r"step +(\d+)  held-out", out) == ["0", "1"]
    with pytest.raises(SystemExit) as exit_info:
        probe.main([*small, "--section", "four"])
    assert exit_info.value.code == 2 and "--section: comma-separated integers" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        probe.main([*small, "--theta", "0"])
    assert exit_info.value.code == 2 and "--theta: must be > 0" in capsys.readouterr().err


def test_same_seed_same_bytes(tmp_path, tiny_vl_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other_seed = build_tiny_model(tmp_path / "other", seed=1)
    reference = _file_hashes(tiny_vl_path)
    assert {"model.safetensors", "tokenizer.json", "config.json", "processor_config.json"} <= set(reference)
    assert _file_hashes(again) == reference
    other = _file_hashes(other_seed)
    assert other["model.safetensors"] != reference["model.safetensors"]
    assert other["tokenizer.json"] == reference["tokenizer.json"]


def test_building_leaves_the_global_rng_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", text_only=True, seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_unknown_architecture_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="arch: unknown tiny architecture 'llava'"):
        build_tiny_model(tmp_path / "m", arch="llava")
