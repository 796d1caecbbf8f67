"""Observation + history -> chat messages, with the real environments and the real tiny model's processor."""

from __future__ import annotations

import pytest
from PIL import Image

from seed_vl.config import EnvConfig, ModelConfig
from seed_vl.envs.registry import make_env
from seed_vl.processors.images import ImageSettings
from seed_vl.processors.messages import HistoryTurn, build_messages
from seed_vl.processors.parsing import parse_action
from seed_vl.processors.prompts import ANSWER_INSTRUCTION, TASK_PREFIX
from seed_vl.skills import SKILL_HEADER, insert_skill

SETTINGS = ImageSettings(ModelConfig().min_pixels, ModelConfig().max_pixels)
RESPONSES = [
    "<think>try</think><action>left</action>",
    "no tags at all",
    "<think>try</think><action>jump</action>",
    "<think>try</think><action>up</action>",
    "<think>try</think><action>right</action>",
]


def play(env_name: str, responses: list[str], seed: int = 1):
    """Run the real environment through the parser, as a rollout does; returns (obs, info, history)."""
    env = make_env(EnvConfig(name=env_name))
    obs, info = env.reset(seed)
    history = []
    for response in responses:
        action, _ = parse_action(response, info["admissible_actions"])
        next_obs, reward, terminated, truncated, next_info = env.step(action)
        history.append(HistoryTurn(obs, response, action, next_info["action_valid"], reward))
        obs, info = next_obs, next_info
        assert not (terminated or truncated)
    return obs, info, history


def texts(content) -> str:
    return (
        content if isinstance(content, str) else "\n".join(i["text"] for i in content if i["type"] == "text")
    )


def images(content) -> list[Image.Image]:
    return [] if isinstance(content, str) else [i["image"] for i in content if i["type"] == "image"]


def test_visual_context_shows_the_last_k_frames_and_the_current_one():
    obs, info, history = play("sokoban_visual", RESPONSES[:3], seed=2)
    system, user = build_messages(
        "sokoban_visual", obs, info, history, history_window=2, image_settings=SETTINGS
    )

    assert system["role"] == "system" and TASK_PREFIX not in system["content"]
    assert user["role"] == "user"
    frames = images(user["content"])
    assert len(frames) == 3  # steps 2 and 3, then the current frame
    assert all(f.size == (84, 84) and f.mode == "RGB" for f in frames)  # 96 px frame, Qwen rule
    # The current frame is the last image; each shown turn's frame precedes its outcome line.
    kinds = [i["type"] for i in user["content"]]
    assert kinds[-2:] == ["image", "text"]
    text = texts(user["content"])
    assert "Step 1" not in text  # outside the window
    assert "Step 2: your answer did not follow the format" in text
    assert "Step 3: 'jump' was an invalid action" in text
    assert "Current observation (step 4):" in text
    assert text.endswith(f"Admissible actions: up, down, left, right\n{ANSWER_INSTRUCTION}")


def test_frames_are_passed_through_without_image_settings():
    obs, info, history = play("sokoban_visual", RESPONSES[:1], seed=2)
    _, user = build_messages("sokoban_visual", obs, info, history, history_window=4, image_settings=None)
    frames = images(user["content"])
    assert frames[0] is history[0].observation["images"][0]
    assert frames[-1] is obs["images"][0]


def test_text_context_is_one_string_with_the_history_observations():
    obs, info, history = play("sokoban_text", RESPONSES[:4], seed=2)
    system, user = build_messages("sokoban_text", obs, info, history, history_window=3)

    assert isinstance(user["content"], str) and isinstance(system["content"], str)
    text = user["content"]
    for step, turn in enumerate(history[1:], start=2):
        assert f"Step {step} observation:\n{turn.observation['text']}" in text
    assert "Previous turns (the last 3 of 4):" in text
    assert "Step 4: you took 'up'; reward -0.1." in text
    assert f"Current observation (step 5):\n{obs['text']}" in text


@pytest.mark.parametrize("window", [0, 1, 10])
def test_history_window(window):
    obs, info, history = play("ezpoints_text", ["<think>a</think><action>+</action>"] * 3)
    _, user = build_messages("ezpoints_text", obs, info, history, history_window=window)
    shown = min(window, len(history))
    assert user["content"].count(" observation:\n") == shown
    assert ("Previous turns" in user["content"]) == (shown > 0)


def test_task_line_is_unique_and_takes_the_skill_block():
    obs, info, history = play("ezpoints_visual", ["<think>a</think><action>+</action>"] * 2)
    messages = build_messages(
        "ezpoints_visual", obs, info, history, history_window=2, image_settings=SETTINGS
    )
    task_lines = [
        line for m in messages for line in texts(m["content"]).splitlines() if line.startswith(TASK_PREFIX)
    ]
    assert task_lines == [f"{TASK_PREFIX} {info['task']}"]

    augmented = insert_skill(messages, "Add the two card values before pressing equals.")
    lines = texts(augmented[1]["content"]).splitlines()
    assert lines[lines.index(task_lines[0]) + 1] == SKILL_HEADER


def test_multi_line_task_is_flattened_to_one_task_line():
    obs, info, _ = play("sokoban_text", [])
    messages = build_messages(
        "sokoban_text", obs, {**info, "task": "Push the box\n  onto the target."}, [], 2
    )
    assert f"{TASK_PREFIX} Push the box onto the target.\n" in messages[1]["content"]


def test_unknown_environment_is_a_clear_error():
    obs, info, _ = play("sokoban_text", [])
    with pytest.raises(ValueError, match="no prompt template for environment 'chess'"):
        build_messages("chess", obs, info, [], 2)


def test_messages_render_through_the_real_vl_processor(tiny_vl_path):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_vl_path)
    obs, info, history = play("sokoban_visual", RESPONSES[:2], seed=2)
    messages = build_messages("sokoban_visual", obs, info, history, history_window=2, image_settings=SETTINGS)
    prompt = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    batch = processor(text=[prompt], images=images(messages[1]["content"]), return_tensors="pt")

    assert f"{TASK_PREFIX} {info['task']}" in prompt
    assert batch["image_grid_thw"].tolist() == [[1, 6, 6]] * 3  # 84 px = 6 patches of 14, no second resize


def test_text_messages_render_through_the_real_tokenizer(tiny_text_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_text_path)
    obs, info, history = play("ezpoints_text", ["<think>a</think><action>9</action>"])  # cards 4 and 3
    messages = build_messages("ezpoints_text", obs, info, history, history_window=2)
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert f"{TASK_PREFIX} {info['task']}" in prompt
    assert prompt.index("Step 1: '9' was an invalid action") < prompt.index(ANSWER_INSTRUCTION)
