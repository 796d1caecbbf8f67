"""`seed-vl reproduce` on a minimal budget: every run trains, the RESULTS table and figures are written, an
interrupted run continues from its checkpoint, --report-only renders the same file from the run records alone
without training, --only trains a subset and reports every run, a recorded run is not trained again, and a
half-finished reproduction says so."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from seed_vl import cli
from seed_vl.config import Config, ConfigError, load_config
from seed_vl.toy import reproduce as reproduce_module
from seed_vl.toy import warmstart
from seed_vl.toy.reproduce import (
    METHODS,
    ReproduceConfig,
    RunResult,
    base_config,
    first_reach,
    planned_runs,
    reproduce,
    run_config,
    write_results,
)


def test_reproduce_on_a_minimal_budget_writes_results(tmp_path, tiny_vl_path, monkeypatch, capsys):
    run_overrides = [
        f"warmstart.base_model={tiny_vl_path}",
        "warmstart.demonstrations=2", "warmstart.analyzer_episodes=0", "warmstart.epochs=1",
        "warmstart.lookup_steps=0", "warmstart.lookup_drills=2",
        "warmstart.perception_steps=0", "warmstart.perception_drills=0",  # overrides reach EZPoints' recipe too
        "warmstart.perception_skill_turns=0", "warmstart.skill_drills=0",
        "model.device=cpu", "train.steps=2", "rollout.num_tasks=1",
        "rollout.group_size=2", "env.max_steps=2", "eval.num_tasks=1", "eval.every=1", "logging.progress=false",
        "checkpoint.every=1", "checkpoint.keep_last=2",
    ]
    args = [
        f"overrides={json.dumps(run_overrides)}", "methods=[grpo, seed]", "seeds=[0, 1]",
        f"output_dir={tmp_path / 'runs'}", f"results={tmp_path / 'RESULTS.md'}",
        f"figures_dir={tmp_path / 'figures'}", f"records_dir={tmp_path / 'records'}",
        "workers=2",  # two worker processes take the runs in turn
        f"warmstart_overrides={json.dumps(['warmstart.lookup_drills=3'])}",  # the base's alone
    ]
    results = reproduce(None, args)

    text = results.read_text()
    assert "| GRPO |" in text and "| SEED (self analyzer) |" in text
    assert "| Method | Sokoban | EZPoints |" in text
    assert "Environment steps to reach GRPO's final success rate" in text
    for task in ("sokoban", "ezpoints"):
        assert (tmp_path / "figures" / f"reproduce_{task}.png").stat().st_size > 0
        for method in ("grpo", "seed"):
            for seed in (0, 1):
                assert (tmp_path / "runs" / f"{task}-{method}-seed{seed}" / "metrics.jsonl").is_file()
    summary = json.loads(results.with_suffix(".json").read_text())
    assert len(summary) == 2 * 2 * 2
    assert all(0.0 <= r["final_success"] <= 1.0 for r in summary)
    base = json.loads((tmp_path / "records" / "base.json").read_text())
    assert base["settings"]["warmstart"]["lookup_drills"] == 3
    assert base["torch_threads"] == torch.get_num_threads()  # built here, in the parent process
    assert base["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "lookup_drills: 2" in (tmp_path / "runs" / "sokoban-grpo-seed0" / "config.yaml").read_text()
    records = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert records == sorted(["base.json", *(f"{t}-{m}-seed{s}.json" for t in ("sokoban", "ezpoints")
                                             for m in ("grpo", "seed") for s in (0, 1))])

    # Report-only: the same file from the run records alone (a clone holding only them), nothing trained.
    results.unlink()
    (tmp_path / "runs").rename(tmp_path / "elsewhere")
    assert reproduce(None, args, report_only=True).read_text() == text
    assert not (tmp_path / "runs").exists()
    (tmp_path / "elsewhere").rename(tmp_path / "runs")

    # Trained side by side or one after another, a run is the same run.
    sequential = tmp_path / "sequential"
    reproduce(None, [*args, "workers=1", "seeds=[0]", "methods=[grpo]", f"output_dir={sequential}",
                     f"records_dir={sequential / 'records'}", f"results={sequential / 'RESULTS.md'}"])
    for task in ("sokoban", "ezpoints"):
        alone = json.loads((sequential / "records" / f"{task}-grpo-seed0.json").read_text())["metrics"]
        side_by_side = json.loads((tmp_path / "records" / f"{task}-grpo-seed0.json").read_text())["metrics"]
        assert [r["train/return"] for r in alone if "train/return" in r] == [
            r["train/return"] for r in side_by_side if "train/return" in r]

    # A recorded run is not trained again, even without its run directory; a run interrupted after its first
    # update (no record yet) continues from that checkpoint.
    shutil.rmtree(tmp_path / "runs" / "sokoban-grpo-seed1")
    mtime = (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime
    interrupted = tmp_path / "runs" / "ezpoints-seed-seed0"
    finished = json.loads((interrupted / "metrics.jsonl").read_text().splitlines()[-1])
    shutil.rmtree(interrupted / "checkpoints" / "step_000002")
    (tmp_path / "records" / "ezpoints-seed-seed0.json").unlink()
    # --only trains just the matching runs (here none is pending) and still reports every finished run.
    interrupted_mtime = (interrupted / "metrics.jsonl").stat().st_mtime
    reproduce(None, args, only=["sokoban-*"])
    assert (interrupted / "metrics.jsonl").stat().st_mtime == interrupted_mtime
    assert not (tmp_path / "records" / "ezpoints-seed-seed0.json").exists()
    assert len(json.loads(results.with_suffix(".json").read_text())) == 7
    with pytest.raises(ConfigError, match="--only: 'sokoban-sdar-seed0' matches no planned run"):
        reproduce(None, args, only=["sokoban-sdar-seed0"])
    reproduce(None, args, only=["ezpoints-seed-seed?"])
    assert not (tmp_path / "runs" / "sokoban-grpo-seed1").exists()
    assert (tmp_path / "records" / "ezpoints-seed-seed0.json").is_file()
    assert (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime == mtime
    records = [json.loads(line) for line in (interrupted / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1]["train/return"] == finished["train/return"]  # step 2 replayed exactly
    timings = [json.loads(p.read_text())["seconds"] for p in (tmp_path / "runs").glob("*/wall_time.json")]
    assert len(timings) == 7 and all(seconds > 0 for seconds in timings)

    # A record of a run from another base is never mixed with runs from this one, in training or in a report.
    other = tmp_path / "records" / "sokoban-seed-seed0.json"
    recorded = other.read_text()
    other.write_text(json.dumps({**json.loads(recorded), "base": "another"}))
    for report_only in (False, True):
        with pytest.raises(ConfigError, match="started from another base"):
            reproduce(None, args, report_only=report_only)
    other.write_text(recorded)
    stray = tmp_path / "records" / "notes.json"
    stray.write_text("{}")
    with pytest.raises(ConfigError, match="notes.json: not a run record"):
        reproduce(None, args)
    stray.unlink()

    # Other warm-start settings would rebuild the shared base under the finished runs: refused, nothing lost.
    with pytest.raises(ConfigError, match="runs started from a warm start"):
        reproduce(None, [
            f"overrides={json.dumps([*run_overrides, 'warmstart.seed=1'])}", "methods=[grpo, seed]",
            "seeds=[0, 1]", f"output_dir={tmp_path / 'runs'}", f"results={tmp_path / 'RESULTS.md'}",
            f"figures_dir={tmp_path / 'figures'}", f"records_dir={tmp_path / 'records'}",
        ])
    assert (tmp_path / "runs" / "sokoban-seed-seed1" / "metrics.jsonl").stat().st_mtime == mtime

    # A code change alone keeps the base the started runs share (a reproduction spans sessions of development).
    built = (tmp_path / "runs" / "warmstart" / "warmstart.json").stat().st_mtime
    monkeypatch.setattr(warmstart, "source_digest", lambda: "edited")
    reproduce(None, args)
    assert "the code has changed since" in capsys.readouterr().err
    assert (tmp_path / "runs" / "warmstart" / "warmstart.json").stat().st_mtime == built
    # So do finished records alone (a fresh clone): their base, copied in or rebuilt bit for bit, is kept.
    (tmp_path / "runs").rename(tmp_path / "elsewhere")
    shutil.copytree(tmp_path / "elsewhere" / "warmstart", tmp_path / "runs" / "warmstart")
    reproduce(None, args)
    assert "the code has changed since" in capsys.readouterr().err
    assert (tmp_path / "runs" / "warmstart" / "warmstart.json").stat().st_mtime == built
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "elsewhere").rename(tmp_path / "runs")

    # A task varied by `task_overrides` shares the base and the other tasks' finished runs: the base is
    # measured on the varied task once, its runs train on it, and its row reports that measure.
    tasks = {"Sokoban": "configs/tiny/sokoban_visual.yaml", "EZPoints-uniform": "configs/tiny/ezpoints_visual.yaml"}
    varied = [*args, "workers=1", "seeds=[0]", "methods=[grpo]", f"tasks={json.dumps(tasks)}",
              f"task_overrides={json.dumps({'EZPoints-uniform': ['env.ezpoints_deal=uniform_pair']})}"]
    with pytest.raises(ConfigError, match="task_overrides.Nope: not a task"):
        reproduce(None, [*varied, f"task_overrides={json.dumps({'Nope': ['env.max_steps=3']})}"])
    sokoban_record = tmp_path / "records" / "sokoban-grpo-seed0.json"
    recorded_at = sokoban_record.stat().st_mtime
    text = reproduce(None, varied).read_text()
    assert sokoban_record.stat().st_mtime == recorded_at  # not trained again
    assert "ezpoints_deal: uniform_pair" in (tmp_path / "runs" / "ezpoints-uniform-grpo-seed0" / "config.yaml").read_text()
    measured = tmp_path / "records" / "base-ezpoints-uniform.json"
    record = json.loads(measured.read_text())
    assert record["env"]["ezpoints_deal"] == "uniform_pair" and "skills/success/correct" in record["measures"]
    row = next(line for line in text.splitlines() if line.startswith("| EZPoints-uniform | "))
    assert row.split(" | ")[4] == f"{100 * record['measures']['skills/success/none']:.1f}"
    assert "EZPoints-uniform: measured the same way on the varied task" in text
    measured_at = measured.stat().st_mtime
    reproduce(None, varied)
    assert measured.stat().st_mtime == measured_at  # measured once per base
    assert reproduce(None, varied, report_only=True).read_text() == text

    # Another setting starts a started run over (never continued under settings it did not start with); a
    # raised budget continues it.
    run_dir, one_run = tmp_path / "runs" / "sokoban-grpo-seed0", [*args, "workers=1", "seeds=[0]", "methods=[grpo]"]
    reproduce(None, [*one_run, f"overrides={json.dumps([*run_overrides, 'train.lr=1e-3'])}"])
    assert "Sokoban / grpo / seed 0: started over (its checkpoint differs in train.lr)" in capsys.readouterr().out
    assert "lr: 0.001" in (run_dir / "checkpoints" / "step_000002" / "config.yaml").read_text()
    reproduce(None, [*one_run, f"overrides={json.dumps([*run_overrides, 'train.lr=1e-3', 'train.steps=3'])}"])
    assert "Sokoban / grpo / seed 0 (continued)" in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2, 3]


def _run(task: str, method: str, seed: int, curve: list[tuple[int, float]]) -> RunResult:
    """A run whose metrics hold these (env steps, held-out success) evaluations, the first at step 0."""
    records = [{"step": k, "env_steps": steps, "eval/success_rate": value} for k, (steps, value) in enumerate(curve)]
    records[0].pop("env_steps")
    return RunResult(task, method, seed, Path(f"runs/{task}-{method}-{seed}"), records)


def test_results_table_reach_steps_and_a_grpo_that_never_beat_the_base(tmp_path):
    cfg = ReproduceConfig(tasks={"Up": "a.yaml", "Flat": "b.yaml"}, methods=["grpo", "seed"], seeds=[0, 1])
    results = []
    for seed in (0, 1):
        results += [
            _run("Up", "grpo", seed, [(0, 0.2), (100, 0.3), (200, 0.4)]),
            _run("Up", "seed", seed, [(0, 0.2), (100, 0.4), (200, 0.5)]),
            _run("Flat", "grpo", seed, [(0, 0.5), (100, 0.4), (200, 0.5)]),
            _run("Flat", "seed", seed, [(0, 0.5), (100, 0.6), (200, 0.6)]),
        ]
    out = tmp_path / "RESULTS.md"
    write_results(cfg, results, out, 1.0, None, [])
    text = out.read_text()

    assert "| grpo | 200 of 200 | base already there |" in text
    assert "| seed | 100 of 200 | base already there |" in text  # SEED reached GRPO's final 0.4 at 100 steps
    assert "`base already there`: GRPO's final success is not above the base policy's" in text
    assert "| SEED (self analyzer) | 45.0 ± 0.0 | 60.0 ± 0.0 |" in text  # the mean over evaluations after step 0
    assert "Preconditions" not in text  # no warm-start measures given: no table


def test_results_show_the_base_policys_skill_preconditions(tmp_path):
    cfg = ReproduceConfig(tasks={"Sokoban": "a.yaml", "EZPoints": "b.yaml"}, methods=["grpo"], seeds=[0])
    measured = {"random_success_rate": 0.375, "one_action/solved": 0.25, "one_action/top_move": 0.75,
                "skills/success/none": 0.25, "skills/success/correct": 0.5, "skills/success/wrong": 0.25,
                "skills/gap/won": 0.61, "skills/gate/won": 0.93, "skills/gap/lost": -0.02,
                "skills/gate/lost": 0.47, "skills/gap_correct/won": 1.34, "skills/gate_correct/won": 0.79,
                "analyzer/valid": 0.9375, "analyzer/agree": 0.5,
                "analyzer/agree_won": float("nan")}
    out = tmp_path / "RESULTS.md"
    cards = {"random_success_rate": 0.0, "first_number/solver": 0.875, "first_number/top_answer": 0.25}
    write_results(cfg, [_run("Sokoban", "grpo", 0, [(0, 0.2), (100, 0.3)])], out, 1.0, None, [],
                  {"Sokoban": measured, "EZPoints": cards})
    text = out.read_text()
    row = "| Sokoban | 37.5 | 25.0 | 75.0 | 25.0 | 50.0 | 25.0 | +0.610 | 0.930 | -0.020 | 0.470 | +1.340 | 0.790 |"
    assert row + " 93.8 | 50.0 | — |" in text
    assert "| EZPoints | 0.0 | 87.5 | 25.0 | — |" in text  # its first number stands in for a one-move task


def test_a_reproduction_rendered_half_way_says_which_cells_lack_seeds(tmp_path):
    cfg = ReproduceConfig(tasks={"Sokoban": "a.yaml", "EZPoints": "b.yaml"}, methods=["grpo", "seed"], seeds=[0, 1, 2])
    results = [_run("Sokoban", "grpo", seed, [(0, 0.2), (100, value)]) for seed, value in ((0, 0.3), (1, 0.5))]
    out = tmp_path / "RESULTS.md"
    write_results(cfg, results, out, 1.0, None, [])
    text = out.read_text()
    assert "**Partial: 2 of 12 runs finished.**" in text
    assert "| GRPO | 40.0 ± 14.1 (2 of 3 seeds) | n/a |" in text
    assert "| SEED (self analyzer) | n/a | n/a |" in text
    assert "reproduce_sokoban.png" in text and "reproduce_ezpoints.png" not in text  # only tasks with a run

    rest = [_run(t, m, s, [(0, 0.2), (100, 0.4)]) for t in ("Sokoban", "EZPoints") for m in ("grpo", "seed")
            for s in (0, 1, 2) if (t, m, s) not in {("Sokoban", "grpo", 0), ("Sokoban", "grpo", 1)}]
    write_results(cfg, results + rest, out, 1.0, None, [])
    text = out.read_text()
    assert "Partial" not in text and "of 3 seeds" not in text and "| GRPO | 40.0 ± 10.0 | 40.0 ± 0.0 |" in text


def test_a_task_and_its_variant_share_one_environment_in_the_base(tmp_path):
    tasks = {"Sokoban": "configs/tiny/sokoban_visual.yaml", "EZPoints": "configs/tiny/ezpoints_visual.yaml",
             "EZPoints-uniform": "configs/tiny/ezpoints_visual.yaml"}
    cfg = load_config(None, [f"tasks={json.dumps(tasks)}", f"output_dir={tmp_path}",
                             f"task_overrides={json.dumps({'EZPoints-uniform': ['env.ezpoints_deal=uniform_pair']})}"],
                      schema=ReproduceConfig)
    assert base_config(cfg).warmstart.envs == ["sokoban_visual", "ezpoints_visual"]
    assert base_config(cfg, cfg.task_overrides["EZPoints-uniform"]).env.ezpoints_deal == "uniform_pair"


def test_the_shared_base_reports_progress_where_the_runs_are_quiet(tmp_path):
    cfg = ReproduceConfig(tasks={"Sokoban": "configs/tiny/sokoban_visual.yaml"}, output_dir=str(tmp_path),
                          overrides=["logging.progress=false"])
    assert base_config(cfg).logging.progress  # one process, an hour or more: its log says where it is
    assert not run_config(cfg, "Sokoban", "grpo", 0, str(tmp_path / "base")).logging.progress


def test_single_runs_are_planned_once_on_the_first_task_and_seed(tmp_path):
    cfg = ReproduceConfig(tasks={"Sokoban": "a.yaml", "EZPoints": "b.yaml"}, methods=["grpo"], seeds=[3, 4],
                          single_runs=["opd-only"])
    assert planned_runs(cfg) == [("Sokoban", "grpo", 3), ("Sokoban", "grpo", 4), ("EZPoints", "grpo", 3),
                                 ("EZPoints", "grpo", 4), ("Sokoban", "opd-only", 3)]
    out = tmp_path / "RESULTS.md"
    write_results(cfg, [_run("Sokoban", "opd-only", 3, [(0, 0.2), (100, 0.3)])], out, 1.0, None, [])
    text = out.read_text()
    assert "**Partial: 1 of 5 runs finished.**" in text
    assert "| OPD alone (diagnostic) | 30.0 ± 0.0 | — |" in text  # one seed planned, one finished: complete
    assert "| GRPO | n/a (0 of 2 seeds) | n/a (0 of 2 seeds) |" not in text and "| GRPO | n/a | n/a |" in text
    assert "| Sokoban | opd-only |" in text and "| EZPoints | opd-only |" not in text  # not planned: no row


@pytest.mark.parametrize("recipe", ["sokoban_visual.yaml", "ezpoints_visual.yaml"])
def test_every_method_loads_and_the_distillation_control_differs_from_its_diagnostic_by_the_gate_alone(recipe):
    recipe = Path(__file__).resolve().parents[1] / "configs" / "tiny" / recipe
    algorithms = {name: load_config(recipe, overrides).algorithm for name, (_, overrides) in METHODS.items()}
    diagnostic, control = algorithms["opd-only"], algorithms["opsd-only"]
    assert (diagnostic.preset, control.preset) == ("seed", "opsd")  # learned gates vs every gate at 1
    assert control.model_copy(update={"preset": "seed"}) == diagnostic
    assert diagnostic.pg_coef == diagnostic.kl_coef == diagnostic.entropy_coef == 0
    assert algorithms["grpo"].pg_coef == 1


def test_the_base_policy_line_averages_seeds_not_runs(tmp_path):
    cfg = ReproduceConfig(tasks={"Sokoban": "a.yaml"}, methods=["grpo", "seed"], seeds=[0, 1],
                          single_runs=["opd-only"])
    results = [_run("Sokoban", m, s, [(0, 0.2 if s == 0 else 0.4), (100, 0.5)]) for m in ("grpo", "seed")
               for s in (0, 1)] + [_run("Sokoban", "opd-only", 0, [(0, 0.2), (100, 0.1)])]
    out = tmp_path / "RESULTS.md"
    write_results(cfg, results, out, 1.0, None, [])
    assert "Base policy (step-0 evaluation, before RL): Sokoban 30.0 ± 14.1" in out.read_text()


def test_a_seed_whose_budget_ended_an_update_later_still_reaches_the_seed_mean_final():
    # Seed 0's budget ran out at update 51, seed 1's at 50: one final evaluation more for seed 0.
    seed0 = [(0, 0.41), (12800, 0.40), (25500, 0.50), (25651, 0.516)]
    seed1 = [(0, 0.40), (12900, 0.44), (25976, 0.461)]
    final = (0.516 + 0.461) / 2
    assert first_reach([seed0, seed1], final) == (25651 + 25976) / 2
    assert math.isnan(first_reach([seed0, seed1], 0.6))


def test_kill_stops_every_worker_cleanly_and_the_same_command_continues(tmp_path, tiny_vl_path):
    def args(steps: int, seeds: str) -> list[str]:
        overrides = [
            f"warmstart.base_model={tiny_vl_path}", "warmstart.demonstrations=2", "warmstart.analyzer_episodes=0",
            "warmstart.epochs=1", "warmstart.lookup_steps=0", "warmstart.lookup_drills=2",
            "warmstart.perception_steps=0", "warmstart.perception_drills=0", "warmstart.perception_skill_turns=0",
            "warmstart.skill_drills=0", "model.device=cpu", f"train.steps={steps}", "rollout.num_tasks=1",
            "rollout.group_size=2", "env.max_steps=2", "eval.num_tasks=1", "eval.every=50",
            "logging.progress=false", "checkpoint.every=1", "checkpoint.keep_last=1",
        ]
        return ["reproduce", f"overrides={json.dumps(overrides)}", "methods=[grpo]", f"seeds={seeds}", "workers=2",
                f"output_dir={tmp_path / 'runs'}", f"records_dir={tmp_path / 'records'}",
                f"results={tmp_path / 'RESULTS.md'}", f"figures_dir={tmp_path / 'figures'}"]

    command = [sys.executable, "-c", "import sys; from seed_vl.cli import main; sys.exit(main(sys.argv[1:]))"]
    runs = [tmp_path / "runs" / f"sokoban-grpo-seed{seed}" for seed in (0, 1)]  # the first two taken
    # 20 runs queued: more than a pipe holds, which the stopped command must not wait to deliver.
    process = subprocess.Popen([*command, *args(100, "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]")], start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not all(list((run / "checkpoints").glob("step_*")) for run in runs):  # both workers training
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(1)
        process.send_signal(signal.SIGTERM)  # the parent alone, as `kill PID` does
        assert process.wait(timeout=120) == 143
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # every process the command started has stopped
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a worker outlived the command"
        time.sleep(0.5)
    assert all(json.loads((run / "wall_time.json").read_text())["seconds"] > 0 for run in runs)
    assert not list((tmp_path / "records").glob("*-grpo-seed*.json"))

    # The same command continues both runs from their checkpoints (to a nearer end: quicker).
    stopped_at = max(len((run / "metrics.jsonl").read_text().splitlines()) for run in runs)
    assert subprocess.run([*command, *args(stopped_at + 1, "[0, 1]")], timeout=900).returncode == 0
    for run in runs:
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(stopped_at + 2))  # every update once: continued, none replayed twice


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_run_stopped_by_ctrl_c_or_kill_still_records_its_wall_time(tmp_path, monkeypatch, signum, status):
    config = Config.model_validate({"train": {"output_dir": str(tmp_path), "run_name": "r"}})

    def stopped(config, **_):
        (tmp_path / "r").mkdir()
        os.kill(os.getpid(), signum)
        time.sleep(30)  # the signal stops the command here

    monkeypatch.setattr(reproduce_module, "train", stopped)
    monkeypatch.setitem(cli.COMMANDS, "reproduce", ("", lambda _: reproduce_module._train_to_the_end(config, "r")))
    handler = signal.getsignal(signal.SIGTERM)
    interrupt = signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores SIGINT
    try:
        assert cli.main(["reproduce"]) == status
    finally:
        signal.signal(signal.SIGINT, interrupt)
    assert json.loads((tmp_path / "r" / "wall_time.json").read_text())["seconds"] > 0
    assert signal.getsignal(signal.SIGTERM) is handler  # restored for whoever called main()
