"""A tiny, randomly initialised Qwen-architecture model written in ordinary Hugging Face format.

Tests and the CPU demo need a real checkpoint without any model hub: `build_tiny_model` writes one that
`AutoModelForImageTextToText` + `AutoProcessor` (or `AutoModelForCausalLM` + `AutoTokenizer` for the
text-only variant) load exactly like a Qwen release. The same seed writes the same bytes.

The tokenizer is a byte-level BPE trained in-process on the text the environments, prompt templates and
analyzer really produce (rendered from solver and random episodes). The vision-language variants use a
phrase-level pre-tokenizer: only digits, newlines, the answer tags `<think>`, `</think>`, `<action>`,
`</action>` and the actions (moves, operators) are split off, so merges may span other words and a
recurring clause of the prompt costs one or two tokens, while a move is the same token in a skill, a
history line and an answer (the text-only variant keeps Qwen2's word-level
pre-tokenizer: `train_tokenizer` says why). A tiny model's compute goes into its sequence length; this tokenizer, the toy's
own (a real run uses its model's), keeps the toy's sequences several times shorter than word-level BPE.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import random
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessor,
    Qwen2VLProcessor,
    Qwen2VLVideoProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
    Qwen3VLVideoProcessor,
)

from seed_vl.io import atomic_directory, content_digest

ARCHITECTURES = ("qwen2_5_vl", "qwen2_vl", "qwen3_vl")
BUILDER_FILE = "tiny_model.json"  # which version of this builder wrote the model

# Qwen's chat-format and vision special tokens, in Qwen's id order.
SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
VOCAB_SIZE = 6144  # BPE cap (embeddings padded to a multiple of 64)
MIN_PIXELS = 4 * 28 * 28  # 56x56
MAX_PIXELS = 256 * 28 * 28  # a 300x300 EZPoints frame fits without downscaling

# Qwen2-VL's chat format: image items become <|vision_start|><|image_pad|><|vision_end|>, which the
# processor expands to one <|image_pad|> per merged vision patch.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Phrase level: split off (and never merge across) digits, line breaks, the answer tags and the actions
# (the four moves, EZPoints' operators), nothing else: a move is one token wherever it appears, in a skill,
# a history line or an answer, so that copying it from a skill is one token's lookup.
_PHRASE_REGEX = r"</?(?:think|action)>|\p{N}|[\r\n]+|\b(?:up|down|left|right)\b|[+*=]"
# Word level, Qwen2's: contractions, letter runs, single digits, punctuation runs, whitespace.
_WORD_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_TEXT_DIMS = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
)
# Qwen's VL releases use 1e6 for 128-wide heads and long contexts; with 32-wide heads nearly all of those
# rotary frequencies barely turn over a ~1k-token context, and the tiny model cannot tell a token two
# positions back from one ten back, which looking a step up in a skill needs (the lookup probe's task
# from random weights, 700 steps: 49% of moves right at 1e6, 99% at 1e4; chance is 25%).
_ROPE_THETA = 1e4
# Qwen2-VL and Qwen2.5-VL split a head's rotary frequencies into (temporal, height, width) sections, fastest
# first: Qwen's [16, 24, 24] of 64 leaves width the slowest. With 16 frequencies at 1e4 that is 0.003 rad or
# less per column, and the tiny decoder hardly tells a box left of the player from one right of it (frame
# -> winning move on one-move Sokoban rooms, minimal prompt, from random weights: 48% right after 200 steps;
# chance 25%; `scripts/rope_probe.py`). A lower base would speed up the width but slow down the lookup,
# which matches a step number at any distance through the slowest frequencies. The tiny model keeps 1e4
# and alternates the sections, as Qwen3-VL interleaves its axes: [0, 1, 1] repeated gives height and width
# every other frequency, fast and slow alike (100% after 200 steps; frames have no time axis, and text,
# whose three axes are equal, rotates as before).


# Everyday instruction English beyond the environment words, so prompts and skills stay short in tokens.
_GENERIC_WORDS = """
a about above across act action actions after again against agent all almost alone along already also although
always am among amount an analysis analyze and another answer any anything apply are area around as ask assistant
at attempt avoid away back bad based be because become been before begin behind being believe below best better
between beyond block blocked board both bottom break bring build but by call can cannot careful case cause cell
center certain chance change check choice choose chosen clear clearly close column come complete completed
condition consider contain context continue control copy correct correctly cost could count course cover create
current danger dead deal decide decision describe description detail did different difficult direct direction
directly distance do does done down during each early easy effect either else empty end enough ensure entire
environment error even every exact exactly example expect explain explanation fact fail failed failure far fast
few field final finally find first fix follow following for form format forward found free from front full
function further gain general get give given go goal goes good got great group guess had half happen happened
hard has have he help her here high him his hold how however idea if image important in include index inside
instead instruction into is it item its itself just keep kind know known large last later lead learn least leave
left less let level like likely limit line list little local long look loop lose lost low made main make many map
mark match may maybe mean means middle might miss missing mistake more most move moved moves moving much must
name near need needed never new next no none nor not note nothing now number object observe obvious of off often
on once one only onto open option or order other our out outcome output over own pair part path pattern perform
pick place plan play please point policy position possible prefer present prevent previous problem process
progress provide push put question quickly rather reach reached read ready reason recent reduce remain remember
repeat result return reuse reward right risk role room row rule run safe same say score second see seen select
sequence set several shape short should show side signal simple since single size skill small so solution solve
solved some something space specific start state step steps still stop strategy stuck success successful such
summary sure system take taken target task than that the their them then there these they thing think this those
three through time to together too top toward track trajectory try turn twice two under understand unless until
up update use used useful user using valid value very view visible wait want was way we well were what when where
whether which while who why will win with within without won word work worked would wrong yes yet you your
zero one two three four five six seven eight nine ten eleven twelve first second third last
"""


def _corpus_lines() -> list[str]:
    """Sentences in the shape the environments, prompt templates and analyzer produce."""
    directions = ["up", "down", "left", "right"]
    sokoban = [
        "You are solving the Sokoban puzzle. You are the player and you need to push all boxes to targets.",
        "When you are right next to a box, you can push it by moving in the same direction.",
        "You cannot push a box through a wall, and you cannot pull a box.",
        "Symbols: # wall, _ floor, O target, X box, P player, √ box on target, S player on target.",
        "The room is a grid of walls, floor, one box and one target. Move the box onto the target.",
        "Your available actions are up, down, left, right.",
    ]
    sokoban += [
        f"Row {i}: # {' '.join(cells)} _ #" for i, cells in enumerate(itertools.product("#_OXP√S", repeat=3))
    ]
    sokoban += [
        f"The player moved {a} and the box moved {b}. The box is {c} of the target."
        for a, b, c in itertools.product(directions, directions, ["above", "below", "left", "right"])
    ]
    ranks = ["A", "2", "3", "4", "5", "6", "7", "8", "9", "10", "J", "Q", "K"]
    ezpoints = [
        "You are an expert card game player. You are observing two cards in the image.",
        "You can choose between ['1', '2', '3', '4', '5', '6', '7', '8', '9', '10', '+', '*', '='].",
        "The number or operator you choose will be appended to the current formula.",
        "Note that 'J', 'Q', and 'K' count as '10', and 'A' counts as '1'.",
        "Your goal is to output a formula that evaluates to 12, and each number can only be used once.",
    ]
    suits = ["Hearts", "Diamonds", "Clubs", "Spades"]
    ezpoints += [
        f"Cards: {rank} of {suit} and King of {suit}." for rank, suit in itertools.product(ranks, suits)
    ]
    ezpoints += [
        "Ace, Jack, Queen and King are face cards; Two, Three, Four, Five, Six, Seven, Eight, Nine, Ten."
    ]
    ezpoints += [
        f"Formula: {a} + {b} = {a + b}. Formula: {a} * {b} = {a * b}."
        for a, b in itertools.product(range(1, 11), repeat=2)
    ]
    rooms = ["kitchen", "bedroom", "bathroom", "cellar", "garden", "hallway", "attic", "pantry", "study"]
    things = ["key", "box", "chest", "door", "table", "shelf", "apple", "lamp", "coin", "book", "drawer"]
    verbs = ["take", "drop", "open", "close", "examine", "eat", "unlock"]
    textworld = [
        f"You are in the {room}. You see a {thing}. Exits lead north, south, east and west."
        for room, thing in itertools.product(rooms, things)
    ]
    textworld += [f"{verb} {thing}" for verb, thing in itertools.product(verbs, things)]
    textworld += [f"go {d}" for d in ["north", "south", "east", "west"]] + ["look", "inventory"]
    textworld += ["Admissible commands: go north, take key from table, open door, unlock chest with key."]
    analyzer = [
        '{"episode_summary": "The agent pushed the box onto the target in 4 steps.", '
        '"episode_skill": "Line up behind the box before pushing it toward the target."}',
        '{"episode_summary": "The agent pushed the box into a corner and failed.", '
        '"episode_skill": "Avoid pushing a box into a corner; it can never be moved out again."}',
        "Task success: true. Task failure: false. Success label, reward, return, step, valid action, invalid action.",
        "Write one short policy-facing skill, not a retrospective explanation.",
        "If the episode succeeded, write a workflow skill: the decision rule and action order that worked.",
        "If the episode failed, write an avoidance rule: the core mistake and its warning signs.",
        "**Episode-Level Skill**",
        "Refer to this episode-level skill when deciding what action to take in the current episode:",
    ]
    instructions = [
        "Think step by step about the current observation, then answer with exactly one action.",
        "Your response should be in the format <think>...</think><action>...</action>.",
        "The history of your previous observations and actions is shown below.",
        "Observation: the current state. Previous action: the action you took at the last step.",
        "You are a helpful assistant. Please answer the question about the image.",
        "system\nuser\nassistant\n",
    ]
    answers = [
        f"<think>The box is {a} of me and the target is {b}, so I move {a}.</think><action>{a}</action>"
        for a, b in itertools.product(directions, directions)
    ]
    answers += [
        f"<think>I have {a} and {12 - a}, so {a} + {12 - a} = 12.</think><action>{a}</action>"
        for a in range(2, 7)
    ]
    answers += ["<think>Use both cards.</think><action>+</action>", "<think>Done.</think><action>=</action>"]
    words = sorted(set(_GENERIC_WORDS.split()))
    generic = [" ".join(words), " ".join(w.capitalize() for w in words), " ".join(f"{w}." for w in words)]
    numbers = [" ".join(str(n) for n in range(101)), '{"a": [1, 2], "b": {"c": null, "d": true, "e": false}}']
    return sokoban + ezpoints + textworld + analyzer + instructions + answers + generic + numbers


def _rendered_lines(episodes_per_env: int = 16) -> list[str]:
    """The text of real prompts, answers and analyzer pairs: solver and random episodes of the Sokoban and
    EZPoints environments, rendered by the same code a rollout and the analyzer use (frames left out)."""
    from seed_vl.analyzer import build_analyzer_prompt, format_analysis
    from seed_vl.config import EnvConfig
    from seed_vl.envs.registry import make_env
    from seed_vl.processors import prompts
    from seed_vl.toy.demonstrations import play_demonstrations, play_random_episodes, terse_response

    lines = []
    rng = random.Random(0)
    for name in ("sokoban_text", "sokoban_visual", "ezpoints_text", "ezpoints_visual"):
        env = EnvConfig(name=name, cell_px=16)
        seeds = list(range(episodes_per_env))
        solved = play_demonstrations(env, episodes_per_env, seed=0, history_window=2, image_settings=None, rng=rng)
        failed = play_random_episodes(env, seeds, history_window=2, image_settings=None, rng=rng)
        game = make_env(env)
        for episode in failed:
            hindsight = game.hindsight(episode.seed, episode.actions, rng)
            episode.summary, episode.skill = hindsight["episode_summary"], hindsight["episode_skill"]
        for episode in solved + failed:
            for turn in episode.turns:
                lines += [_text_of(turn.context), turn.response_text, terse_response(turn.response_text)]
            prompt = build_analyzer_prompt(episode, with_images=False, max_steps=15)
            lines += [_text_of(prompt), format_analysis(episode.summary, episode.skill)]
    # Outcomes the scripted actors never produce: answers that do not parse, rejected moves.
    for step, action, reward in itertools.product((1, 2, 3), (None, "up", "left", "5", "+", "="), (-0.1, 0.0, -1.0)):
        lines += [prompts.outcome_line(step, action, False, reward), prompts.outcome_line(step, action, True, reward)]
    return lines


def _text_of(messages: list[dict]) -> str:
    return "\n".join(
        m["content"] if isinstance(m["content"], str) else "".join(i.get("text", "") for i in m["content"])
        for m in messages
    )


@functools.cache
def tokenizer_corpus() -> tuple[str, ...]:
    return (*_corpus_lines(), *_rendered_lines())


def train_tokenizer(
    corpus: tuple[str, ...] | None = None, vocab_size: int = VOCAB_SIZE, *, phrases: bool = True
) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen2's normalizer and special tokens, trained on `corpus` (default: ours).

    `phrases=False` keeps Qwen2's word-level pre-tokenizer and class: transformers loads every `qwen2`
    checkpoint with `Qwen2Tokenizer`, which imposes that pre-tokenizer, so the text-only variant has to
    be trained with it (a vision-language checkpoint keeps the tokenizer its tokenizer.json describes)."""
    corpus = tokenizer_corpus() if corpus is None else corpus
    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PHRASE_REGEX if phrases else _WORD_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    tokenizer_class = PreTrainedTokenizerFast if phrases else Qwen2Tokenizer
    tokenizer = tokenizer_class(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


_MODEL_CLASSES: dict[str, tuple[type[PreTrainedConfig], type[PreTrainedModel]]] = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
    "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
    "qwen3_vl": (Qwen3VLConfig, Qwen3VLForConditionalGeneration),
}
# Vision towers: 2 blocks, patch 14 (Qwen3-VL: 16), 2x2 patch merge; Qwen2.5-VL keeps one windowed block.
_VISION_DIMS = {
    "qwen2_5_vl": dict(hidden_size=64, intermediate_size=128, window_size=112, fullatt_block_indexes=[1]),
    "qwen2_vl": dict(embed_dim=64, mlp_ratio=2),
    "qwen3_vl": dict(
        hidden_size=64, intermediate_size=128, num_position_embeddings=64, deepstack_visual_indexes=[0]
    ),
}


def _check_arch(arch: str) -> None:
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"arch: unknown tiny architecture {arch!r}; choose one of {', '.join(ARCHITECTURES)}"
        )


def _mrope(arch: str, head_dim: int) -> dict:
    """Multimodal RoPE parameters: Qwen3-VL's (temporal, height, width) split in the proportions of Qwen's
    [16, 24, 24] for 128, interleaved; the others' sections alternate height and width (see above)."""
    half = head_dim // 2
    if arch == "qwen3_vl":
        spatial = (half - half // 4) // 2
        return {"mrope_section": [half - 2 * spatial, spatial, spatial], "mrope_interleaved": True}
    return {"mrope_section": [0, 1, 1] * (half // 2)}


def tiny_config(
    arch: str, tokenizer: PreTrainedTokenizerFast, text_dims: dict | None = None, vision_dims: dict | None = None
) -> PreTrainedConfig:
    """The tiny configuration of `arch` ("qwen2" for the text-only model): real Qwen layouts, small sizes.
    `text_dims` / `vision_dims` override the sizes (the scoring benchmark builds a scaled model this way)."""
    ids = tokenizer.convert_tokens_to_ids
    text = {
        **_TEXT_DIMS,
        **(text_dims or {}),
        "vocab_size": 64 * -(-len(tokenizer) // 64),
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
    }
    if arch == "qwen2":
        return Qwen2Config(**text, rope_parameters={"rope_type": "default", "rope_theta": _ROPE_THETA},
                           tie_word_embeddings=True)
    _check_arch(arch)
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": _ROPE_THETA, **_mrope(arch, head_dim)}
    if arch == "qwen3_vl":
        text["head_dim"] = head_dim
    out_key = "hidden_size" if arch == "qwen2_vl" else "out_hidden_size"  # the tower's output width
    vision = {
        "depth": 2,
        "num_heads": 4,
        **_VISION_DIMS[arch],
        out_key: text["hidden_size"],
        **(vision_dims or {}),
    }
    return _MODEL_CLASSES[arch][0](
        text_config=text,
        vision_config=vision,
        tie_word_embeddings=True,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )


def _processor(arch: str, tokenizer: PreTrainedTokenizerFast):
    pixels = dict(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    if arch == "qwen3_vl":  # 16-pixel patches, mean/std 0.5, like Qwen3-VL releases
        half = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
        image_processor = Qwen2VLImageProcessor(
            patch_size=16, min_pixels=4 * 32 * 32, max_pixels=MAX_PIXELS, **half
        )
        return Qwen3VLProcessor(
            image_processor, tokenizer, Qwen3VLVideoProcessor(**half), chat_template=CHAT_TEMPLATE
        )
    processor_class = Qwen2_5_VLProcessor if arch == "qwen2_5_vl" else Qwen2VLProcessor
    return processor_class(
        Qwen2VLImageProcessor(**pixels),
        tokenizer,
        Qwen2VLVideoProcessor(**pixels),
        chat_template=CHAT_TEMPLATE,
    )


def build_tiny_model(
    out_dir: str | os.PathLike,
    text_only: bool = False,
    seed: int = 0,
    arch: str = "qwen2_5_vl",
    *,
    text_dims: dict | None = None,
    vision_dims: dict | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Write a tiny `arch` model (or a Qwen2 causal LM when `text_only`) and its processor to `out_dir`.
    `device` and `dtype` serve scaled-up builds (`scripts/gpu_smoke.py` initialises 3B weights on a GPU)."""
    _check_arch(arch)
    arch = "qwen2" if text_only else arch
    tokenizer = train_tokenizer(phrases=not text_only)
    config = tiny_config(arch, tokenizer, text_dims, vision_dims)
    with torch.random.fork_rng(devices=[]), torch.device(device):  # the caller's RNG is untouched
        torch.manual_seed(seed)
        model = _MODEL_CLASSES[arch][1](config).to(dtype).eval()
    text = config.get_text_config()
    model.generation_config = GenerationConfig(
        bos_token_id=text.bos_token_id,
        eos_token_id=[text.eos_token_id, text.pad_token_id],
        pad_token_id=text.pad_token_id,
    )
    out = Path(out_dir)
    with atomic_directory(out) as tmp:
        model.save_pretrained(tmp)
        if text_only:
            tokenizer.save_pretrained(tmp)
        else:
            _processor(arch, tokenizer).save_pretrained(tmp)
        (tmp / BUILDER_FILE).write_text(json.dumps({"builder": builder_digest()}) + "\n")
    return out


def builder_digest() -> str:
    """A digest of this file: a tiny model written by another version of it is out of date."""
    return content_digest(Path(__file__).read_bytes())


def built_by_another_version(model_dir: str | os.PathLike) -> bool:
    """Whether `model_dir` holds a tiny model that an older (or newer) builder wrote; a model without the
    builder's record (one of the user's own) never is."""
    record = Path(model_dir) / BUILDER_FILE
    return record.is_file() and json.loads(record.read_text()).get("builder") != builder_digest()
