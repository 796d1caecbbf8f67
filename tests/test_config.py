import subprocess
import sys

import pytest
import yaml

from seed_vl.config import REDACTED, Config, ConfigError, load_config, save_config


def _write(tmp_path, text: str):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_recipe_and_overrides_resolve_into_typed_config(tmp_path):
    recipe = _write(tmp_path, "rollout:\n  group_size: 4\nenv:\n  name: ezpoints_text\n")
    cfg = load_config(recipe, ["rollout.group_size=2", "train.lr=3e-4", "env.dim_room=[7, 7]"])
    assert isinstance(cfg, Config)
    assert cfg.rollout.group_size == 2
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.env.name == "ezpoints_text" and cfg.env.dim_room == (7, 7)
    assert cfg.algorithm.gate_beta == 5.0  # untouched default


@pytest.mark.parametrize(
    ("recipe", "overrides", "named"),
    [
        ("rollout:\n  group_sise: 4\n", [], "rollout.group_sise: unknown key"),
        ("", ["rollout.group_size=many"], "rollout.group_size"),
        ("", ["train.lr=-1"], "train.lr"),
        ("", ["rollout.top_p=1.5"], "rollout.top_p"),
        ("", ["nosuchsection.x=1"], "nosuchsection: unknown key"),
        ("", ["env.name=chess"], "env.name"),
        ("", ["rollout.group_size"], "bad override 'rollout.group_size'"),
        ("", ["rollout.group_size.x=1"], "rollout.group_size"),
        ("rollout: [1, 2\n", [], "not valid YAML"),
        ("- 1\n- 2\n", [], "must hold a mapping"),
        ("", ["model.min_pixels=1000000", "model.max_pixels=5000"], "min_pixels must not exceed max_pixels"),
        ("", ["warmstart.demonstrations={sokoban_visual: 10}"], "warmstart: demonstrations"),
        ("", ["warmstart.demonstrations=0"], "warmstart: demonstrations"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path, recipe, overrides, named):
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, recipe), overrides)
    message = str(err.value)
    assert named in message
    assert "\n" not in message


def test_missing_recipe_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.yaml"):
        load_config(tmp_path / "nope.yaml")


def test_saved_config_redacts_secrets_but_keeps_token_counts(tmp_path):
    cfg = load_config(None, ["analyzer.api_key_env=MY_KEY_VAR", "rollout.max_new_tokens=77"])
    out = tmp_path / "run" / "config.yaml"
    save_config(cfg, out)
    saved = yaml.safe_load(out.read_text())
    assert saved["analyzer"]["api_key_env"] == REDACTED
    assert "MY_KEY_VAR" not in out.read_text()
    assert saved["rollout"]["max_new_tokens"] == 77
    assert not list(out.parent.glob("*.tmp"))  # written atomically, nothing left behind


def test_cli_usage_error_is_one_line_exit_2():
    proc = subprocess.run(
        [sys.executable, "-m", "seed_vl.cli", "make-tiny-model", "--seed", "x", "--out", "o"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--seed" in proc.stderr
    assert "Traceback" not in proc.stderr
