"""Skill insertion (DESIGN §1 stage 2 step 3) and the static SDAR skill bank."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import get_args

import pytest
from PIL import Image

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs.registry import make_env
from seed_vl.processors.messages import HistoryTurn, build_messages
from seed_vl.processors.prompts import TASK_PREFIX, template_for
from seed_vl.skills import SKILL_HEADER, SKILL_INSTRUCTION, insert_skill, load_skill_bank

REPO = Path(__file__).resolve().parents[1]
SKILL = "Push the box from the side opposite its target."
BLOCK = f"{SKILL_HEADER}\n{SKILL_INSTRUCTION}\n[{SKILL}]"


def test_block_goes_right_after_the_task_line_in_text_items():
    frame = Image.new("RGB", (4, 4))
    context = [
        {"role": "system", "content": "You are an agent."},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": frame},
                {"type": "text", "text": f"Intro\n{TASK_PREFIX} push the box\nObservation: grid"},
            ],
        },
    ]
    before = copy.deepcopy(context[0]), context[1]["content"][1]["text"]

    augmented = insert_skill(context, SKILL)

    assert (
        augmented[1]["content"][1]["text"] == f"Intro\n{TASK_PREFIX} push the box\n{BLOCK}\nObservation: grid"
    )
    assert augmented[1]["content"][0]["image"] is frame  # images are shared, not copied
    assert (context[0], context[1]["content"][1]["text"]) == before  # the ordinary context is untouched
    assert augmented[0] == context[0]


@pytest.mark.parametrize("env_name", ["sokoban_visual", "ezpoints_text"])
def test_real_contexts_get_the_block_between_task_line_and_hint(env_name):
    env_config = EnvConfig(name=env_name)
    env = make_env(env_config)
    obs, info = env.reset(seed=3)
    history = [HistoryTurn(obs, "<action>up</action>", "up", True, -0.1)]
    context = build_messages(env_name, obs, info, history, history_window=2)
    ordinary = copy.deepcopy(context)

    augmented = insert_skill(context, SKILL)

    def texts(ctx):
        content = ctx[1]["content"]
        return [content] if isinstance(content, str) else [i["text"] for i in content if i["type"] == "text"]

    expected = f"{TASK_PREFIX} {info['task']}\n{BLOCK}\n{template_for(env_name).hint}\n"
    assert texts(augmented)[0].startswith(f"{template_for(env_name).intro}\n{expected}")
    assert texts(augmented)[0].replace(f"{BLOCK}\n", "") == texts(ordinary)[0]
    assert texts(augmented)[1:] == texts(ordinary)[1:]
    assert augmented[0] == context[0]  # the system prompt holds no task line
    assert texts(context) == texts(ordinary)


def test_string_content_and_task_line_at_the_end():
    context = [{"role": "user", "content": f"{TASK_PREFIX} reach 12"}]
    augmented = insert_skill(context, SKILL)
    assert augmented[0]["content"] == f"{TASK_PREFIX} reach 12\n{BLOCK}"
    assert context[0]["content"] == f"{TASK_PREFIX} reach 12"


def test_only_the_first_task_line_gets_the_block():
    text = f"{TASK_PREFIX} a\nhistory\n{TASK_PREFIX} a\n"
    augmented = insert_skill([{"role": "user", "content": text}], SKILL)
    assert augmented[0]["content"] == f"{TASK_PREFIX} a\n{BLOCK}\nhistory\n{TASK_PREFIX} a\n"


def test_no_task_line_is_a_clear_error():
    with pytest.raises(ValueError, match="no task line"):
        insert_skill([{"role": "user", "content": f"mention of {TASK_PREFIX} mid-line only"}], SKILL)


def test_shipped_skill_bank_covers_every_environment():
    bank = load_skill_bank(REPO / "configs" / "skill_bank.yaml")
    env_names = get_args(EnvConfig.model_fields["name"].annotation)
    for name in env_names:
        skill = bank.skill_for(name)
        assert len(skill.split()) >= 5 and "\n" not in skill


def test_skill_bank_json_lists_and_lookup_errors(tmp_path):
    path = tmp_path / "bank.json"
    path.write_text(json.dumps({"sokoban_text": ["Find the target first.", "Then push   straight."]}))
    bank = load_skill_bank(path)
    assert bank.skill_for("sokoban_text") == "Find the target first. Then push straight."
    with pytest.raises(ConfigError, match="no skill for task type 'textworld'.*sokoban_text"):
        bank.skill_for("textworld")


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("missing.yaml", None, "file not found"),
        ("bad.yaml", "a: [unclosed", "not valid YAML"),
        ("bad.json", "{not json", "not valid JSON"),
        ("list.yaml", "- a\n- b\n", "must map task types"),
        ("empty_skill.yaml", "sokoban_text: ''\n", "'sokoban_text' must be a skill text"),
        ("number.yaml", "sokoban_text: [1, 2]\n", "'sokoban_text' must be a skill text"),
    ],
)
def test_bad_skill_bank_files_are_one_line_config_errors(tmp_path, name, text, message):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message) as err:
        load_skill_bank(path)
    assert "\n" not in str(err.value) and "algorithm.skill_bank" in str(err.value)
