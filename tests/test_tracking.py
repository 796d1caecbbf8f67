import json

from seed_vl.config import load_config
from seed_vl.tracking import MetricsLogger, Phase, progress


def test_metrics_jsonl_and_offline_wandb_never_see_a_secret(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = load_config(None, ["analyzer.api_key_env=VERY_SECRET_VARIABLE", "analyzer.backend=external"])
    logger = MetricsLogger(tmp_path, cfg, use_wandb=True, run_name="t")
    logger.log(1, {"train/success_rate": 0.25})
    logger.log(2, {"train/success_rate": 0.5})
    logger.close()

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records == [{"step": 1, "train/success_rate": 0.25}, {"step": 2, "train/success_rate": 0.5}]
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1  # offline, since no key is set
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"VERY_SECRET_VARIABLE" not in path.read_bytes(), path


def test_disabled_logger_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path, load_config(None), enabled=False)
    logger.log(1, {"x": 1.0})
    assert not (tmp_path / "metrics.jsonl").exists()


def test_phase_prints_one_plain_line_when_not_a_tty(capsys):
    with Phase("step 1 rollout", total=3, unit="episodes") as bar:
        bar.update(2)
        bar.update(1)
    assert list(progress(range(4), "scoring", unit="actions")) == [0, 1, 2, 3]
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("[seed-vl] step 1 rollout: 3 episodes in ")
    assert lines[1].startswith("[seed-vl] scoring: 4 actions in ")
    assert bar.seconds >= 0.0


def test_a_long_phase_reports_its_count_while_it_runs(capsys, monkeypatch):
    monkeypatch.setattr(Phase, "line_every_s", 0.0)  # every update is "long after" the last line
    with Phase("warm start: sft", total=2, unit="steps") as bar:
        bar.update()
        bar.update()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" after ")[0] for line in lines[:2]] == [
        "[seed-vl] warm start: sft: 1/2 steps", "[seed-vl] warm start: sft: 2/2 steps"
    ]
    assert lines[2].startswith("[seed-vl] warm start: sft: 2 steps in ") and len(lines) == 3
    with Phase("quiet", total=2, enabled=False) as bar:
        bar.update(2)
    assert capsys.readouterr().err == ""
