"""The warm start on a tiny budget: real environments, the real tiny model built and loaded through HF."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seed_vl.analyzer import parse_analysis
from seed_vl.config import ConfigError, load_config, save_config
from seed_vl.io import model_digest
from seed_vl.policy import Policy
from seed_vl.toy import demonstrations, lookup_pretraining, tiny_model, warmstart


def tiny_budget(tmp: Path, *overrides: str):
    """Two demonstrations and two analyzer episodes per environment, one epoch, two short evaluations."""
    return load_config(
        None,
        [
            f"warmstart.base_model={tmp / 'tiny-vl'}",
            f"warmstart.out_dir={tmp / 'warmstart'}",
            "warmstart.demonstrations=2",
            "warmstart.analyzer_episodes=2",
            "warmstart.epochs=1",
            "model.device=cpu",
            "env.cell_px=28",
            "env.image_size=112",
            "env.max_steps=6",
            "rollout.max_new_tokens=6",
            "analyzer.max_new_tokens=12",
            "analyzer.attempts=1",
            "eval.num_tasks=2",
            "logging.progress=false",
            *overrides,
        ],
    )


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("warm")
    config = tiny_budget(tmp)
    return config, warmstart.run_warmstart(config)


def test_builds_the_base_model_and_writes_model_and_summary(warm):
    config, model_dir = warm
    assert model_dir == Path(config.warmstart.out_dir) / "model"
    assert (Path(config.warmstart.base_model) / "config.json").is_file()  # built because it was missing
    policy = Policy.from_config(config.model, path=model_dir)
    assert policy.is_vision

    summary = json.loads((model_dir.parent / "warmstart.json").read_text())
    examples = summary["examples"]
    assert examples["demonstration_turns"] >= 2 * 2 and examples["analyzer_pairs"] == 2 * 2
    sft = summary["sft"]
    assert (
        sft["steps"] >= 1 and len(sft["loss_curve"]) == min(10, sft["steps"]) and min(sft["loss_curve"]) > 0
    )
    assert set(summary["base"]) == {"sokoban_visual", "ezpoints_visual"}
    for rates in summary["base"].values():
        assert 0.0 <= rates["success_rate"] <= 1.0 and 0.0 <= rates["analyzer/valid"] <= 1.0
        assert 0.0 <= rates["random_success_rate"] <= 1.0
        assert rates["episode_length"] >= 1
    assert 0.0 <= summary["base"]["sokoban_visual"]["one_action/solved"] <= 1.0  # EZPoints has no such task
    ezpoints = summary["base"]["ezpoints_visual"]
    assert "one_action/solved" not in ezpoints and 0.0 <= ezpoints["first_number/solver"] <= 1.0
    assert 0.5 <= ezpoints["first_number/top_answer"] <= 1.0  # 2 held-out deals: one answer takes one or both
    assert summary["settings"]["warmstart"]["demonstrations"] == 2 and summary["wall_time_s"] > 0
    assert not list(model_dir.parent.parent.glob(".warmstart.*"))  # no temporary directory left behind


def test_reuses_the_cache_without_training(warm, monkeypatch):
    config, model_dir = warm
    weights = model_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("the cached warm start was trained again")

    monkeypatch.setattr(warmstart, "train_sft", no_training)
    assert warmstart.run_warmstart(config) == model_dir
    # a new config object with the same settings, a different RL recipe section included
    same = tiny_budget(Path(config.warmstart.out_dir).parent, "train.steps=3", "algorithm.preset=grpo")
    assert warmstart.run_warmstart(same) == model_dir
    assert weights.stat().st_mtime_ns == before


def test_same_seed_same_bytes_and_a_changed_setting_retrains(warm, tmp_path):
    config, model_dir = warm
    again = tiny_budget(Path(config.warmstart.out_dir).parent, f"warmstart.out_dir={tmp_path / 'again'}")
    assert (
        warmstart.run_warmstart(again).joinpath("model.safetensors").read_bytes()
        == (model_dir / "model.safetensors").read_bytes()
    )

    other = tiny_budget(
        Path(config.warmstart.out_dir).parent, f"warmstart.out_dir={tmp_path / 'again'}", "warmstart.seed=1"
    )
    retrained = warmstart.run_warmstart(other)
    assert json.loads((retrained.parent / "warmstart.json").read_text())["settings"]["warmstart"]["seed"] == 1
    assert (retrained / "model.safetensors").read_bytes() != (model_dir / "model.safetensors").read_bytes()


def test_an_unfinished_output_directory_is_redone(warm, tmp_path):
    config, model_dir = warm
    out = tmp_path / "interrupted"
    (out / "model").mkdir(parents=True)  # a model directory without its summary: never reused
    redo = tiny_budget(Path(config.warmstart.out_dir).parent, f"warmstart.out_dir={out}")
    assert warmstart.cached_key(out) is None
    warmstart.run_warmstart(redo)
    assert warmstart.cached_key(out) == json.loads((model_dir.parent / "warmstart.json").read_text())["key"]


def test_a_text_warm_start_builds_and_trains_the_text_model(tmp_path):
    config = tiny_budget(tmp_path, "warmstart.envs=[sokoban_text, ezpoints_text]", "env.name=sokoban_text")
    model_dir = warmstart.run_warmstart(config)
    assert not Policy.from_config(config.model, path=model_dir).is_vision
    summary = json.loads((model_dir.parent / "warmstart.json").read_text())
    assert set(summary["base"]) == {"sokoban_text", "ezpoints_text"}
    assert summary["examples"]["analyzer_pairs"] == 2 * 2


def test_demonstration_counts_can_differ_per_environment(tmp_path):
    per_env = tiny_budget(
        tmp_path, "warmstart.demonstrations={sokoban_visual: 1, ezpoints_visual: 3}", "warmstart.analyzer_episodes=0"
    )
    one_each = tiny_budget(tmp_path, "warmstart.demonstrations=1", "warmstart.analyzer_episodes=0")
    sokoban, ezpoints = (warmstart.env_config(per_env, name) for name in ("sokoban_visual", "ezpoints_visual"))

    assert len(warmstart.warmstart_examples(per_env, [ezpoints], None)[0]) == 3 * 4  # card, operator, card, '='
    assert warmstart.warmstart_examples(per_env, [sokoban], None) == warmstart.warmstart_examples(
        one_each, [sokoban], None
    )


def test_analyzer_pairs_hold_both_workflow_skills_and_avoidance_rules(tmp_path):
    config = tiny_budget(tmp_path, "env.max_steps=15")
    env = warmstart.env_config(config, "sokoban_visual")
    examples = warmstart.analyzer_examples(config, env, 8, None, random.Random(0))
    outcomes = {ex.context[0]["content"].split("Outcome: ")[1].split()[0] for ex in examples}
    assert outcomes == {"success", "failure"}
    for example in examples:
        assert parse_analysis(example.response, min_words=config.analyzer.min_skill_words) is not None
        assert example.end_of_turn


def test_a_base_model_from_another_builder_version_is_rebuilt_and_a_users_own_kept(tmp_path):
    config = tiny_budget(tmp_path)
    base = warmstart.ensure_base_model(config)
    record = base / tiny_model.BUILDER_FILE
    assert json.loads(record.read_text())["builder"] == tiny_model.builder_digest()
    record.write_text(json.dumps({"builder": "an older builder"}))
    (base / "model.safetensors").write_bytes(b"stale")
    assert warmstart.ensure_base_model(config) == base and (base / "model.safetensors").read_bytes() != b"stale"
    record.unlink()  # no builder record: the user's own model, never replaced
    (base / "model.safetensors").write_bytes(b"theirs")
    assert warmstart.ensure_base_model(config) == base and (base / "model.safetensors").read_bytes() == b"theirs"


def test_lookup_pretraining_comes_first_and_is_cached(tmp_path, monkeypatch, capsys):
    config = tiny_budget(tmp_path, "warmstart.lookup_steps=2")
    base = warmstart.ensure_base_model(config)
    assert "lookup pretraining ended at" in capsys.readouterr().err  # two steps do not learn it: a warning
    assert base == tmp_path / "tiny-vl-lookup"
    summary = json.loads((base / lookup_pretraining.SUMMARY_FILE).read_text())
    assert summary["steps"] == 2 and {kind: len(c) for kind, c in summary["move_accuracy"].items()} == {
        "lookup": 1, "copy": 1}
    assert model_digest(base) != model_digest(tmp_path / "tiny-vl")  # trained, beside the untouched base
    assert Policy.from_config(config.model, path=base).is_vision  # loads through HF with its processor

    monkeypatch.setattr(lookup_pretraining, "train_lookup", lambda *a, **k: pytest.fail("retrained"))
    assert warmstart.ensure_base_model(config) == base
    assert "lookup pretraining ended at" in capsys.readouterr().err  # said again when the cache is reused
    summary["move_accuracy"]["lookup"] = [warmstart.LOOKUP_LEARNT]  # as if learnt
    (base / lookup_pretraining.SUMMARY_FILE).write_text(json.dumps(summary))
    assert warmstart.ensure_base_model(config) == base
    assert "lookup pretraining" not in capsys.readouterr().err
    assert warmstart.warmstart_key(config) != warmstart.warmstart_key(tiny_budget(tmp_path))


def test_the_same_weights_under_another_configuration_are_another_base(tmp_path):
    """A tiny model rebuilt with another rotary layout has the same weights: its caches must not match."""
    config = tiny_budget(tmp_path)
    base = warmstart.ensure_base_model(config)
    key = warmstart.warmstart_key(config)
    settings = json.loads((base / "config.json").read_text())
    settings["text_config"]["rope_parameters"]["mrope_section"] = [4, 6, 6]
    (base / "config.json").write_text(json.dumps(settings))
    assert warmstart.warmstart_key(config) != key


def test_frozen_attention_leaves_the_decoders_attention_untouched(tmp_path):
    config = tiny_budget(tmp_path, "warmstart.freeze_attention=true", "warmstart.envs=[sokoban_visual]")
    trained = load_file(warmstart.run_warmstart(config) / "model.safetensors")
    base = load_file(tmp_path / "tiny-vl" / "model.safetensors")
    attention = [n for n in base if ".self_attn." in n and "visual" not in n]
    mlp = [n for n in base if ".mlp." in n and "visual" not in n]
    assert attention and all(torch.equal(base[n], trained[n]) for n in attention)
    assert all(not torch.equal(base[n], trained[n]) for n in mlp)


@pytest.mark.parametrize("layers", [None, [1]])
def test_the_analyzer_sft_trains_the_attention_the_first_sft_froze(tmp_path, layers):
    config = tiny_budget(
        tmp_path, "warmstart.freeze_attention=true", "warmstart.envs=[sokoban_visual]",
        "warmstart.analyzer_sft_episodes=2", "warmstart.analyzer_sft_replay=2",
        f"warmstart.analyzer_sft_attention_layers={json.dumps(layers)}", "warmstart.analyzer_sft_policy_episodes=2",
    )
    model_dir = warmstart.run_warmstart(config)
    trained, base = load_file(model_dir / "model.safetensors"), load_file(tmp_path / "tiny-vl" / "model.safetensors")
    attention = [n for n in base if ".self_attn." in n and "visual" not in n]
    chosen = [n for n in attention if layers is None or ".layers.1.self_attn." in n]
    assert chosen and all(not torch.equal(base[n], trained[n]) for n in chosen)
    assert all(torch.equal(base[n], trained[n]) for n in attention if n not in chosen)
    stage1 = json.loads((model_dir.parent / "warmstart.json").read_text())["analyzer_sft"]
    assert stage1["steps"] == math.ceil(stage1["examples"] / config.warmstart.batch_size) and stage1["loss_curve"]
    assert stage1["policy_episodes"]["pairs"] == 2  # the scripted analyzer labels every Sokoban episode


def test_the_analyzer_sft_learns_the_policys_own_episodes_labelled_by_the_scripted_analyzer(warm):
    config, model_dir = warm
    config = config.model_copy(
        update={
            "warmstart": config.warmstart.model_copy(update={"analyzer_sft_policy_episodes": 3}),
            "rollout": config.rollout.model_copy(update={"num_tasks": 1, "group_size": 2}),  # two batches
        }
    )
    policy = Policy.from_pretrained(model_dir, seed=0)
    envs = [warmstart.env_config(config, name) for name in config.warmstart.envs]
    pairs, success = warmstart.policy_analyzer_examples(policy, config, envs)
    assert len(pairs) == 3 * len(envs) and list(success) == config.warmstart.envs
    prompts = [prompt_text(p) for p in pairs]
    for k, env in enumerate(envs):
        won = sum("Outcome: success" in p for p in prompts[3 * k : 3 * k + 3])
        assert success[env.name] == round(won / 3, 4) and env.name.split("_")[0] in prompts[3 * k].lower()
    assert all(parse_analysis(p.response, config.analyzer.min_skill_words) for p in pairs)
    stage1 = warmstart.analyzer_sft_examples(config, envs, policy.image_settings)
    assert not set(prompts) & {prompt_text(e) for e in stage1}  # unseen episodes
    again, _ = warmstart.policy_analyzer_examples(policy, config, envs)
    assert [(p.context, p.response) for p in again] == [(p.context, p.response) for p in pairs]  # same seed


def test_an_analyzer_sft_layer_the_model_lacks_is_a_one_line_error_before_any_training(tmp_path):
    config = tiny_budget(
        tmp_path, "warmstart.analyzer_sft_episodes=2", "warmstart.analyzer_sft_attention_layers=[0, 9]"
    )
    with pytest.raises(ConfigError, match=r"^warmstart.analyzer_sft_attention_layers: no decoder layer 9 \("):
        warmstart.run_warmstart(config)
    assert not (tmp_path / "warmstart").exists()


def test_analyzer_sft_pairs_are_unseen_episodes_with_long_rooms_beside_replays(tmp_path):
    config = tiny_budget(
        tmp_path, "env.max_steps=15", "warmstart.envs=[sokoban_visual]", "warmstart.lookup_drills=2",
        "warmstart.analyzer_sft_episodes=6", "warmstart.analyzer_sft_replay=4",
    )
    env = warmstart.env_config(config, "sokoban_visual")
    examples = warmstart.analyzer_sft_examples(config, [env], None)
    prompts = [e.context[-1]["content"] for e in examples]
    pairs = [p for p in prompts if isinstance(p, str) and p.startswith("You are reviewing")]
    assert prompts[: len(pairs)] == pairs and len(pairs) == 12  # 6 episodes on default rooms, 6 on rooms of 3+
    first_sft = warmstart.analyzer_examples(config, env, 6, None, random.Random(0))
    assert not {e.context[-1]["content"] for e in first_sft} & set(pairs)
    long_room_wins = pairs[6:9]  # the solver's half of the rooms of 3+ moves
    assert all("Outcome: success" in p and "step 3 " in p.split("Actions taken: ")[1] for p in long_room_wins)
    demonstration_turns, drills = examples[len(pairs) : -4], examples[-4:]  # 2 lookup + 2 copy drills
    assert demonstration_turns and all("<action>" in e.response for e in demonstration_turns)
    assert [e.response.startswith("{") for e in drills] == [False, True, False, True]


def test_terse_response_keeps_the_last_sentence_and_the_action():
    long = "<think>The box is 1 up from me and its target is 1 left. I push the box at step 3</think><action>up</action>"
    assert demonstrations.terse_response(long) == "<think>I push the box at step 3</think><action>up</action>"
    assert demonstrations.terse_response("no answer format") == "no answer format"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("warmstart.envs=[sokoban_visual, sokoban_text]", "warmstart.envs"),
        ("warmstart.envs=[chess]", "warmstart.envs"),
    ],
)
def test_bad_environment_lists_are_one_line_config_errors(override, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, [override])


def test_a_base_recorded_before_a_setting_existed_matches_at_its_default_only():
    recipe = "configs/tiny/sokoban_visual.yaml"
    recorded = json.loads(json.dumps(warmstart.warmstart_settings(load_config(recipe))))
    for env in recorded["envs"]:
        del env["min_solution_moves"]  # as a base built before the setting existed recorded it
    del recorded["warmstart"]["seed"]  # the recipe keeps the default
    assert warmstart.same_warmstart_settings(recorded, load_config(recipe))
    for changed in ("env.min_solution_moves=3", "warmstart.seed=1", "warmstart.skill_drills=3600"):
        assert not warmstart.same_warmstart_settings(recorded, load_config(recipe, [changed]))
    assert not warmstart.same_warmstart_settings(None, load_config(recipe))


def test_warmstart_table_measures_a_model_as_the_warm_start_measured_it(warm, tmp_path):
    config, model_dir = warm
    recipe, out = tmp_path / "recipe.yaml", tmp_path / "measured.json"
    save_config(config, recipe)
    script = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "warmstart_table.py")]
    result = subprocess.run([*script, "--measure", str(model_dir), "--config", str(recipe), "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    recorded = json.loads((model_dir.parent / "warmstart.json").read_text())["base"]["sokoban_visual"]
    assert json.loads(out.read_text())["base"] == {"sokoban_visual": recorded}
    assert f"| {out} | sokoban_visual | {100 * recorded['skills/success/none']:.1f} |" in result.stdout

    bad = subprocess.run([*script, "--measure", str(model_dir), "--config", str(recipe), "env.bogus=1", "--out",
                          str(out)], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: env.bogus: unknown key"


def prompt_text(example) -> str:
    """The text of an example's last message, its images left out."""
    content = example.context[-1]["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)
