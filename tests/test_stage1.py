"""Stage 1 end to end with the tiny models: collect -> analyzer labels -> SFT."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from seed_vl.analyzer import parse_analysis
from seed_vl.cli import main
from seed_vl.config import ConfigError, load_config
from seed_vl.policy import Policy
from seed_vl.processors.images import ImageSettings
from seed_vl.sft import SFTExample, SFTSettings, encode_examples, response_nll, train_sft
from seed_vl.stage1 import collect, load_analysis_examples, sft

TINY_IMAGES = ImageSettings(min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28)


def stage1_config(model_path: str, env_name: str, tmp_path, *overrides: str):
    """A few short episodes: two steps each, a handful of sampled tokens per step."""
    return load_config(
        None,
        [
            f"model.path={model_path}",
            "model.device=cpu",
            f"model.min_pixels={TINY_IMAGES.min_pixels}",
            f"model.max_pixels={TINY_IMAGES.max_pixels}",
            f"env.name={env_name}",
            "env.max_steps=2",
            "rollout.max_new_tokens=6",
            "rollout.num_tasks=1",  # one task per chunk: the dataset is written in two chunks
            "rollout.history_window=1",
            "collect.num_tasks=2",
            "collect.group_size=2",
            f"collect.out_dir={tmp_path / 'data'}",
            "analyzer.backend=scripted",
            "logging.progress=false",
            *overrides,
        ],
    )


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def user_text(context: list[dict]) -> str:
    content = context[-1]["content"]
    return content if isinstance(content, str) else "".join(i.get("text", "") for i in content)


@pytest.fixture(scope="module")
def ezpoints_data(tiny_text_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ezpoints")
    return collect(stage1_config(tiny_text_path, "ezpoints_text", tmp))


@pytest.fixture(scope="module")
def sokoban_data(tiny_vl_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sokoban")
    return collect(stage1_config(tiny_vl_path, "sokoban_visual", tmp))


# ------------------------------------------------------------------------------------------------ collect
def test_collect_writes_trajectories_and_analyzer_pairs(ezpoints_data, tiny_text_path):
    trajectories = read_jsonl(ezpoints_data / "trajectories.jsonl")
    assert [t["seed"] for t in trajectories] == [0, 0, 1, 1]  # two tasks, a group of two each
    assert all(t["length"] == 2 and len(t["turns"]) == 2 for t in trajectories)

    pairs = read_jsonl(ezpoints_data / "sft.jsonl")
    labelled = [i for i, t in enumerate(trajectories) if t["analyzer_status"] == "ok"]
    assert [p["trajectory"] for p in pairs] == labelled and labelled
    for pair in pairs:
        traj = trajectories[pair["trajectory"]]
        assert parse_analysis(pair["target"], min_words=5) == (traj["summary"], traj["skill"])
        (message,) = pair["messages"]
        assert traj["turns"][-1]["response_text"] in message["content"]  # the analyzer prompt of that episode

    counts = json.loads((ezpoints_data / "dataset.json").read_text())
    assert counts["trajectories"] == 4 and counts["labelled"] == len(pairs)
    assert counts["no_skill"] + counts["analyzer_errors"] == 4 - len(pairs)
    assert counts["success_rate"] == sum(t["won"] for t in trajectories) / 4
    saved = yaml.safe_load((ezpoints_data / "config.yaml").read_text())
    assert saved["model"]["path"] == tiny_text_path and saved["collect"]["num_tasks"] == 2


def test_collect_is_deterministic_and_keeps_only_valid_skills(ezpoints_data, tiny_text_path, tmp_path):
    # The same seed replays the same rollouts; a skill shorter than min_skill_words is no skill.
    config = stage1_config(tiny_text_path, "ezpoints_text", tmp_path, "analyzer.min_skill_words=1000")
    again = collect(config)
    analyzer_fields = ("skill", "summary", "analyzer_status")

    def rollouts(data_dir) -> list[dict]:
        return [
            {k: v for k, v in t.items() if k not in analyzer_fields}
            for t in read_jsonl(data_dir / "trajectories.jsonl")
        ]

    assert rollouts(again) == rollouts(ezpoints_data)
    assert {t["analyzer_status"] for t in read_jsonl(again / "trajectories.jsonl")} == {"no_skill"}
    assert (again / "sft.jsonl").read_text() == ""
    counts = json.loads((again / "dataset.json").read_text())
    assert counts["labelled"] == 0 and counts["no_skill"] == 4


def test_visual_prompts_reference_the_stored_frames(sokoban_data):
    trajectories = read_jsonl(sokoban_data / "trajectories.jsonl")
    pairs = read_jsonl(sokoban_data / "sft.jsonl")
    examples = load_analysis_examples(sokoban_data)
    assert len(examples) == len(pairs) > 0
    for pair, example in zip(pairs, examples, strict=True):
        turns = trajectories[pair["trajectory"]]["turns"]
        stored = [item["image"] for item in pair["messages"][0]["content"] if item["type"] == "image"]
        assert stored == [fid for turn in turns for fid in turn["images"]]  # each step's own frame, in order
        loaded = [item["image"] for item in example.context[0]["content"] if item["type"] == "image"]
        assert [image.size for image in loaded] == [(96, 96)] * len(stored)  # 6x6 room, 16 px per cell
        assert example.end_of_turn and example.response == pair["target"]


# ---------------------------------------------------------------------------------------------------- sft
def test_sft_loss_counts_answer_tokens_only(ezpoints_data, tiny_text_path):
    policy = Policy.from_pretrained(tiny_text_path, device="cpu")
    example = load_analysis_examples(ezpoints_data)[0]
    (encoded,), skipped = encode_examples(policy, [example], max_length=4096)
    answer = policy.tokenizer.encode(example.response, add_special_tokens=False) + [
        policy.tokenizer.eos_token_id
    ]
    assert skipped == 0 and encoded.response_ids == answer

    nll, tokens = response_nll(policy, [encoded])
    assert tokens == len(answer)
    # Independently: the full sequence through the HF model, cross-entropy over the answer positions only.
    prompt = policy.tokenizer.apply_chat_template(
        example.context, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, :-1]
    per_token = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")
    assert nll == pytest.approx(float(per_token[-len(answer) :].sum()), rel=1e-4)
    assert float(per_token.sum()) > nll * 1.5  # the prompt tokens would have weighed a lot


def test_overlong_examples_are_skipped_and_counted(ezpoints_data, tiny_text_path):
    policy = Policy.from_pretrained(tiny_text_path, device="cpu")
    examples = load_analysis_examples(ezpoints_data)
    short = SFTExample([{"role": "user", "content": "Task: say ok"}], "<think>ok</think><action>ok</action>")
    kept, skipped = encode_examples(policy, [*examples, short], max_length=64)
    assert skipped == len(examples) and [e.context for e in kept] == [short.context]
    with pytest.raises(ConfigError, match=r"sft\.max_length"):
        train_sft(policy, examples, SFTSettings(max_length=64), show_progress=False)


def test_sft_on_a_visual_dataset(sokoban_data, tiny_vl_path, tmp_path):
    out_dir = tmp_path / "sft"
    config = stage1_config(
        tiny_vl_path,
        "sokoban_visual",
        tmp_path,
        f"sft.data=[{sokoban_data}]",
        "sft.epochs=3",
        "sft.batch_size=4",
        "sft.lr=3e-3",
        f"sft.out_dir={out_dir}",
        "checkpoint.every=2",
        "checkpoint.keep_last=1",
        "train.micro_batch_size=2",
    )
    before = Policy.from_pretrained(tiny_vl_path, device="cpu")
    analysis, _ = encode_examples(before, load_analysis_examples(sokoban_data), max_length=4096)
    nll_before, _ = response_nll(before, analysis)

    model_dir = sft(config)

    assert model_dir == out_dir / "model"
    after = Policy.from_pretrained(model_dir, device="cpu")
    assert after.is_vision
    nll_after, _ = response_nll(after, analysis)
    assert nll_after < 0.9 * nll_before  # the training examples' answer loss went down

    summary = json.loads((out_dir / "sft.json").read_text())
    assert summary["trained_on"] == summary["analyzer_examples"] == len(analysis)
    steps = 3 * -(-summary["trained_on"] // 4)
    metrics = read_jsonl(out_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1)) == list(range(1, summary["steps"] + 1))
    assert all(m["sft/loss"] > 0 for m in metrics)
    (last,) = (out_dir / "checkpoints").iterdir()  # keep_last=1: the final step's checkpoint
    assert last.name == f"step_{steps:06d}" and (last / "model" / "config.json").is_file()


def test_bad_data_dir_is_a_one_line_error(tmp_path, capsys):
    missing = tmp_path / "no-such-dataset"
    assert main(["sft", f"sft.data=[{missing}]", f"sft.out_dir={tmp_path / 'out'}"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and err.count("\n") == 1

    with pytest.raises(ConfigError, match="has no sft.jsonl"):
        load_analysis_examples(tmp_path)


def test_malformed_dataset_lines_name_file_and_line(ezpoints_data, tmp_path):
    good = (ezpoints_data / "sft.jsonl").read_text().splitlines()[0]
    broken = tmp_path / "sft.jsonl"
    for bad_line, problem in [
        ('{"messages": [', "line 2 is not valid JSON"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "line 2: needs a non-empty 'target'"),
        (
            '{"messages": [{"role": "user", "content": [{"type": "image", "image": "f00"}]}], "target": "x"}',
            "line 2: frame 'f00' not found",
        ),
    ]:
        broken.write_text(f"{good}\n{bad_line}\n")
        with pytest.raises(ConfigError) as err:
            load_analysis_examples(tmp_path)
        assert str(broken) in str(err.value) and problem in str(err.value)


def test_image_prompts_need_a_vision_model(sokoban_data, tiny_text_path, tmp_path):
    config = stage1_config(tiny_text_path, "sokoban_visual", tmp_path, f"sft.data=[{sokoban_data}]")
    with pytest.raises(ConfigError, match="text-only model"):
        sft(config)
