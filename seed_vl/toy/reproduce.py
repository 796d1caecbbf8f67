"""Toy-scale reproduction of the paper's comparison (Table 8): GRPO, GRPO+OPSD and SEED from one warm-started
base, several seeds each, equal environment-step budgets; writes a RESULTS.md table and learning curves.

It may take hours on a CPU, so it resumes: the same command again skips finished runs and continues an
unfinished one from its last checkpoint (`checkpoint.every` in the recipe sets how much a crash can cost); a
run whose checkpoint was trained under other settings (the budget aside) starts over.
Each run's wall time is recorded in its `wall_time.json`. A finished run leaves a record in `records_dir`
(its settings, base-model digest, wall time and the metrics the results show): the results are rendered from
these records alone, so committed records re-render RESULTS.md on any clone (`--report-only`) and a
reproduction continued on another machine skips the runs they hold.
"""

from __future__ import annotations

import fnmatch
import json
import math
import multiprocessing
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from seed_vl.checkpoint import list_checkpoints, load_trainer_state
from seed_vl.config import Config, ConfigError, EnvConfig, Section, load_config, to_dict
from seed_vl.io import atomic_write_text, model_digest
from seed_vl.plots import Run, draw_runs
from seed_vl.policy import Policy
from seed_vl.toy.perception_probe import BLIND_FIRST_NUMBER
from seed_vl.toy.warmstart import (
    MODEL_DIR,
    SUMMARY_FILE,
    cached_key,
    env_config,
    measure_base_policy,
    run_warmstart,
    same_warmstart_settings,
    warmstart_key,
)
from seed_vl.tracking import read_metrics
from seed_vl.trainer import run_dir_for, run_finished, train

DISTILLATION_ALONE = ["analyzer.backend=scripted", "algorithm.pg_coef=0", "algorithm.kl_coef=0",
                      "algorithm.entropy_coef=0"]  # no policy-gradient, KL or entropy term; scripted skills
# Method -> (name in the tables, config overrides). Presets, labelled toy variants, a diagnostic and its control.
METHODS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("GRPO", ["algorithm.preset=grpo"]),
    "opsd": ("GRPO+OPSD", ["algorithm.preset=opsd"]),
    "seed": ("SEED (self analyzer)", ["algorithm.preset=seed"]),
    "sdar": ("SDAR (skill bank)", ["algorithm.preset=sdar"]),
    # The scripted analyzer's skills are correct by construction: an upper bound on skill quality.
    "seed-scripted": ("SEED (scripted analyzer)", ["algorithm.preset=seed", "analyzer.backend=scripted"]),
    "seed-lambda1": ("SEED, lambda = 1 (toy ablation)", ["algorithm.preset=seed", "algorithm.opd_coef=1.0"]),
    # Diagnostic: the distillation term alone (no policy gradient, KL or entropy), scripted skills.
    "opd-only": ("OPD alone (diagnostic)", ["algorithm.preset=seed", *DISTILLATION_ALONE]),
    # Its control: the same term with every gate fixed at 1, i.e. NLL on the policy's own samples, whose
    # expected gradient is zero on-policy: what it does to the student is the drift of fitting its own samples.
    "opsd-only": ("OPSD alone (control: gates fixed at 1)", ["algorithm.preset=opsd", *DISTILLATION_ALONE]),
}
BUDGET_SETTINGS = {"train.steps", "train.env_step_budget"}  # raised, they continue a run; any other change restarts it
WALL_TIME_FILE = "wall_time.json"  # in each run directory: its training seconds, summed over sessions
BASE_RECORD = "base.json"  # in `records_dir`: the shared base's digest, warm-start settings, measures, wall time
BUILT_WITH = ("torch", "transformers", "numpy", "pillow")  # library versions recorded with the base
# What `base.json` keeps of the warm start's summary: its settings, measures, wall time and what else
# may decide its bytes (torch's thread count; the CPU instruction set torch's kernels use).
BASE_SUMMARY_KEYS = ("note", "settings", "examples", "base", "wall_time_s", "torch_threads", "cpu_capability")
# Diagnostics the results tabulate (mean over training steps); a run record keeps these, the evaluations and
# the training success and return, not the run's every metric.
DIAGNOSTICS = ["train/success_rate", "rollout/equal_return_groups", "analyzer/success_rate", "analyzer/skill_words",
               "gate_mean", "gate_open_frac", "opd_loss", "kl", "entropy"]
RECORDED_KEYS = {"step", "env_steps", "train/return", *DIAGNOSTICS}


class ReproduceConfig(Section):
    tasks: dict[str, str] = {  # label -> tiny recipe; the first one's warm start, over every task, is the base
        "Sokoban": "configs/tiny/sokoban_visual.yaml",
        "EZPoints": "configs/tiny/ezpoints_visual.yaml",
    }
    methods: list[str] = ["grpo", "opsd", "seed"]  # keys of METHODS, each run on every task with every seed
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2], min_length=1)
    # Keys of METHODS run once, on the first task with the first seed: labelled ablations and diagnostics.
    single_runs: list[str] = []
    overrides: list[str] = []  # applied to every run and to the base's warm start, e.g. "train.steps=20"
    # Task label -> overrides applied to that task's runs alone, after `overrides`: a variant of a task
    # trained from the same base (e.g. "env.ezpoints_deal=uniform_pair"); the base's warm start ignores them.
    task_overrides: dict[str, list[str]] = {}
    # Applied to the shared base's warm start alone (settings only the first recipe accepts, e.g. Sokoban's
    # skill drills); the base's digest in every run record stands for them.
    warmstart_overrides: list[str] = []
    output_dir: str = "runs/reproduce"
    records_dir: str = "runs/reproduce/records"  # one JSON per finished run, which the results are rendered from
    workers: int = Field(1, ge=1)  # runs trained side by side, one process each, the CPU cores split between them
    results: str = "docs/RESULTS.md"
    figures_dir: str = "docs/figures"


def planned_runs(cfg: ReproduceConfig) -> list[tuple[str, str, int]]:
    """Every (task, method, seed) the reproduction trains: each method on every task and seed, each single
    run once on the first task with the first seed."""
    every = [(task, method, seed) for task in cfg.tasks for method in cfg.methods for seed in cfg.seeds]
    return every + [(next(iter(cfg.tasks)), method, cfg.seeds[0]) for method in cfg.single_runs]


@dataclass
class RunResult:
    task: str
    method: str
    seed: int
    source: Path  # the run's record file
    records: list[dict]
    wall_time_s: float = 0.0

    def final(self, key: str) -> float:
        values = [r[key] for r in self.records if key in r]
        return values[-1] if values else math.nan

    def curve(self, key: str) -> list[tuple[float, float]]:
        """(environment steps, value) of every record holding `key` (the step-0 evaluation sits at 0)."""
        return [(r.get("env_steps", 0), r[key]) for r in self.records if key in r]

    def mean(self, key: str) -> float:
        values = [r[key] for r in self.records if key in r]
        return statistics.fmean(values) if values else math.nan

    def mean_after_start(self, key: str) -> float:
        """Mean of `key` over the evaluations after the step-0 one (nan: none)."""
        values = [value for _, value in self.curve(key)[1:]]
        return statistics.fmean(values) if values else math.nan


def run_name(task: str, method: str, seed: int) -> str:
    """The run's directory and record name, e.g. `sokoban-seed-seed0`."""
    return f"{task.lower()}-{method}-seed{seed}"


def base_config(cfg: ReproduceConfig, extra: Sequence[str] = ()) -> Config:
    """The shared base's warm start, one for every task, method and seed: the first recipe's over every task's
    environment, kept in the reproduction's own directory so that a demo cannot replace it; `extra`: further
    overrides (a varied task's, to measure the base on it). A task and its variant share one environment.
    It reports its progress (an hour or more on a CPU) even where the runs, side by side, do not."""
    envs = dict.fromkeys(load_config(recipe, cfg.overrides).env.name for recipe in cfg.tasks.values())
    return load_config(next(iter(cfg.tasks.values())), [
        *cfg.overrides,
        *cfg.warmstart_overrides,
        f"warmstart.envs=[{', '.join(envs)}]",
        f"warmstart.out_dir={Path(cfg.output_dir) / 'warmstart'}",
        "logging.progress=true",
        *extra,
    ])


def run_config(cfg: ReproduceConfig, task: str, method: str, seed: int, base_model: str) -> Config:
    return load_config(
        cfg.tasks[task],
        [
            *cfg.overrides,
            *cfg.task_overrides.get(task, []),
            f"model.path={base_model}",
            *METHODS[method][1],
            f"train.seed={seed}",
            f"train.output_dir={cfg.output_dir}",
            f"train.run_name={run_name(task, method, seed)}",
        ],
    )


def run_settings(cfg: ReproduceConfig, task: str, method: str, seed: int) -> dict[str, Any]:
    """What a run record must match to stand for the run (where its files live does not count)."""
    overrides = [*cfg.overrides, *cfg.task_overrides.get(task, []), *METHODS[method][1]]
    return {"recipe": cfg.tasks[task], "overrides": overrides, "seed": seed}


def reproduce(
    config_path: str | None, overrides: list[str], *, report_only: bool = False, only: Sequence[str] = ()
) -> Path:
    """Train every (task, method, seed) run not finished yet, then write the results from every finished run;
    `report_only`: only write them; `only`: train just the runs whose names match one of these patterns."""
    cfg = load_config(config_path, overrides, schema=ReproduceConfig)
    for task, recipe in cfg.tasks.items():
        if not Path(recipe).is_file():
            raise ConfigError(f"tasks.{task}: recipe not found: {recipe}")
    for task in cfg.task_overrides:
        if task not in cfg.tasks:
            raise ConfigError(f"task_overrides.{task}: not a task (they are {', '.join(cfg.tasks)})")
    for field, methods in (("methods", cfg.methods), ("single_runs", cfg.single_runs)):
        for method in methods:
            if method not in METHODS:
                raise ConfigError(f"{field}: unknown method '{method}' (choose from {', '.join(METHODS)})")
    names = [run_name(*run) for run in planned_runs(cfg)]
    for pattern in only:
        if not fnmatch.filter(names, pattern):
            raise ConfigError(f"--only: '{pattern}' matches no planned run (they are {', '.join(names)})")

    envs = [load_config(recipe, cfg.overrides).env.name for recipe in cfg.tasks.values()]
    first = base_config(cfg)
    warmstart_dir = Path(first.warmstart.out_dir)
    base_model = str(warmstart_dir / MODEL_DIR)
    records_dir = Path(cfg.records_dir)
    runs = {(task, method, seed): run_config(cfg, task, method, seed, base_model)
            for task, method, seed in planned_runs(cfg)}
    if not report_only:
        # The base that started runs or finished records share is kept across code changes.
        in_use = (any(list_checkpoints(run_dir_for(c) / "checkpoints") for c in runs.values())
                  or _is_recorded_base(warmstart_dir, records_dir))
        if not in_use or cached_key(warmstart_dir) == warmstart_key(first):
            run_warmstart(first)
        elif not same_warmstart_settings(_read_json(warmstart_dir / SUMMARY_FILE).get("settings"), first):
            raise ConfigError(
                f"{cfg.output_dir}: its runs started from a warm start that the current settings would rebuild; "
                "remove the directory (or set output_dir) to start over, or pass --report-only"
            )
        else:  # a reproduction spans sessions: a code change alone does not discard the base its runs share
            print(f"[reproduce] the code has changed since {warmstart_dir} was built; the runs that share it "
                  "continue from it (remove the directory to rebuild)", file=sys.stderr)
        base = _record_base(warmstart_dir, records_dir)
        for task, env in zip(cfg.tasks, envs, strict=True):
            if task in cfg.task_overrides:
                variant = base_config(cfg, cfg.task_overrides[task])
                measure_task_variant(variant, env_config(variant, env), records_dir / _task_base_record(task), base)
        pending = []
        for (task, method, seed), run_cfg in runs.items():
            settings = run_settings(cfg, task, method, seed)
            chosen = not only or any(fnmatch.fnmatch(run_name(task, method, seed), p) for p in only)
            if chosen and _finished_record(records_dir, run_cfg, settings) is None:  # a record: a finished run
                pending.append(_PendingRun(run_cfg, settings, task, method, f"{task} / {method} / seed {seed}"))
        if cfg.workers > 1 and len(pending) > 1:
            _train_side_by_side(pending, min(cfg.workers, len(pending)), records_dir, base)
        else:
            for run in pending:
                _train_and_record(run, records_dir, base)

    base_record = _read_json(records_dir / BASE_RECORD)
    results = []
    for (task, method, seed), run_cfg in runs.items():
        record = _finished_record(records_dir, run_cfg, run_settings(cfg, task, method, seed))
        if record is not None:
            path = _record_path(records_dir, run_cfg)
            if record["base"] != base_record.get("digest"):
                raise ConfigError(f"{path}: started from another base than {records_dir / BASE_RECORD} describes; "
                                  "the results would mix bases")
            results.append(RunResult(task, method, seed, path, record["metrics"], record["wall_time_s"]))
    if not results:
        raise ConfigError(f"{records_dir}: no record of a finished run to report")
    for task in cfg.tasks:
        task_runs = [Run(r.source, r.method, r.records) for r in results if r.task == task]
        if task_runs:
            draw_runs(task_runs, Path(cfg.figures_dir) / f"reproduce_{task.lower()}.png")
    minutes = (base_record.get("wall_time_s", 0.0) + sum(r.wall_time_s for r in results)) / 60
    measured = {task: base_record.get("base", {}).get(env) for task, env in zip(cfg.tasks, envs, strict=True)}
    for task in cfg.task_overrides:  # measured by `measure_task_variant`, on this base only
        variant = _read_json(records_dir / _task_base_record(task))
        measured[task] = variant.get("measures") if variant.get("base") == base_record.get("digest") else None
    preconditions = {task: metrics for task, metrics in measured.items() if metrics}
    write_results(cfg, results, Path(cfg.results), minutes, config_path, overrides, preconditions)
    return Path(cfg.results)


@dataclass
class _PendingRun:
    config: Config
    settings: dict[str, Any]
    task: str
    method: str
    label: str


def _train_and_record(run: _PendingRun, records_dir: Path, base: str) -> None:
    _train_to_the_end(run.config, run.label)
    _write_run_record(records_dir, run.config, run.settings, base, run.task, run.method)


def _train_side_by_side(pending: list[_PendingRun], workers: int, records_dir: Path, base: str) -> None:
    """Train `pending` in `workers` processes, each taking the next run when it finishes one. Ctrl-C or kill
    stops every worker as it stops a single run (wall times recorded, checkpoints kept): the same command
    continues them."""
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    queue = context.Queue()
    queue.cancel_join_thread()  # workers stopped early leave runs undelivered: exit without feeding them
    for run in [*pending, *[None] * workers]:  # one None per worker: no run left
        queue.put(run)
    threads = max(1, (os.cpu_count() or 1) // workers)
    processes = [
        context.Process(target=_worker, args=(queue, records_dir, base, threads), name=f"reproduce-worker-{k}")
        for k in range(workers)
    ]
    try:
        for process in processes:
            process.start()
        for process in processes:
            process.join()
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: the worker stops as after Ctrl-C
                process.join()
    failed = [process.name for process in processes if process.exitcode]
    if failed:
        raise RuntimeError(f"{', '.join(failed)} failed (see the errors above); the same command continues")


def _worker(queue: Any, records_dir: Path, base: str, threads: int) -> None:
    """One process of `_train_side_by_side`: trains queued runs until it takes a None."""
    # Stopped by the parent alone (its Ctrl-C or kill): SIGTERM acts as Ctrl-C does in the CLI, so `finally`
    # blocks run, and the terminal's Ctrl-C, which reaches every process, is left to the parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    torch.set_num_threads(threads)
    try:
        while (run := queue.get()) is not None:
            _train_and_record(run, records_dir, base)
    except KeyboardInterrupt:
        sys.exit(130)


def _is_recorded_base(warmstart_dir: Path, records_dir: Path) -> bool:
    """Whether the warm start in `warmstart_dir` is the base `records_dir`'s finished runs started from (the
    same bytes: built here earlier, rebuilt bit for bit, or copied in)."""
    recorded = _read_json(records_dir / BASE_RECORD).get("digest")
    return recorded is not None and cached_key(warmstart_dir) is not None and (
        model_digest(warmstart_dir / MODEL_DIR) == recorded)


def _record_base(warmstart_dir: Path, records_dir: Path) -> str:
    """Describe the shared base in `records_dir` (its digest: the same settings, code, libraries and torch
    thread count rebuild the same bytes) and return its digest; refused when a run record there started from another base."""
    digest = model_digest(warmstart_dir / MODEL_DIR)
    for path in sorted(records_dir.glob("*.json")):
        if path.name == BASE_RECORD:
            continue
        record = _read_json(path)
        if "base" not in record:
            raise ConfigError(f"{path}: not a run record (it has no 'base'); move it out of {records_dir}")
        if record["base"] != digest:
            raise ConfigError(
                f"{path}: started from another base than the warm start in {warmstart_dir} ({digest}); move the "
                "records away (or set records_dir) to start over"
            )
    summary = _read_json(warmstart_dir / SUMMARY_FILE)
    kept = {key: summary[key] for key in BASE_SUMMARY_KEYS if key in summary}
    versions = {name: metadata.version(name) for name in BUILT_WITH}  # what else decides the bytes
    record = {"digest": digest, "built_with": versions, **kept}
    atomic_write_text(records_dir / BASE_RECORD, json.dumps(record, indent=1) + "\n")
    return digest


def _task_base_record(task: str) -> str:
    return f"base-{task.lower()}.json"


def measure_task_variant(config: Config, env: EnvConfig, path: Path, base: str) -> None:
    """The shared base's measures (`measure_base_policy`, as its warm start took them) on a task that
    `task_overrides` vary, recorded in `path` once per base and environment: the warm start measured the
    recipes' own environments only."""
    env_settings = env.model_dump(mode="json")
    if (recorded := _read_json(path)).get("base") == base and recorded.get("env") == env_settings:
        return
    print(f"[reproduce] measuring the base on {path.stem.removeprefix('base-')}", file=sys.stderr)
    policy = Policy.from_config(config.model, path=Path(config.warmstart.out_dir) / MODEL_DIR, trainable=False)
    measures = measure_base_policy(policy, config, env)
    record = {"base": base, "env": env_settings, "measures": measures}
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")


def _record_path(records_dir: Path, config: Config) -> Path:
    return records_dir / f"{run_dir_for(config).name}.json"


def _finished_record(records_dir: Path, config: Config, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The run's record, if it holds a run on these settings that finished under the current budget."""
    record = _read_json(_record_path(records_dir, config))
    if record.get("settings") != settings or not record.get("metrics"):
        return None
    metrics = record["metrics"]
    env_steps = max(r.get("env_steps", 0) for r in metrics)
    return record if run_finished(config.train, metrics[-1]["step"], env_steps) else None


def _write_run_record(
    records_dir: Path, config: Config, settings: dict[str, Any], base: str, task: str, method: str
) -> None:
    run_dir = run_dir_for(config)
    metrics = [{k: v for k, v in r.items() if k in RECORDED_KEYS or k.startswith("eval/")} for r in read_metrics(run_dir)]
    record = {"task": task, "method": method, "settings": settings, "base": base,
              "wall_time_s": round(_wall_time_s(run_dir), 1), "metrics": metrics}
    atomic_write_text(_record_path(records_dir, config), json.dumps(record, indent=None) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON record, empty when absent; a bad one names its file."""
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from None


def run_status(config: Config) -> str:
    """'finished', 'unfinished' (a checkpoint to continue from), 'absent', or 'stale: FIELDS' (a checkpoint
    trained under other settings than `config`'s, which FIELDS name: the run starts over)."""
    checkpoints = list_checkpoints(run_dir_for(config) / "checkpoints")
    if not checkpoints:
        return "absent"
    changed = changed_settings(load_config(checkpoints[-1] / "config.yaml"), config)
    if changed:
        return f"stale: {', '.join(changed)}"
    state = load_trainer_state(checkpoints[-1])
    return "finished" if run_finished(config.train, state.step, state.counters["env_steps"]) else "unfinished"


def changed_settings(before: Config, after: Config) -> list[str]:
    """Dotted names of the settings that differ, the budget aside: a raised budget continues a run."""
    flat_before, flat_after = _flatten(to_dict(before)), _flatten(to_dict(after))
    return sorted(name for name in flat_before.keys() | flat_after.keys()
                  if name not in BUDGET_SETTINGS and flat_before.get(name) != flat_after.get(name))


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _train_to_the_end(config: Config, label: str) -> None:
    status = run_status(config)
    if status == "finished":
        return
    if status.startswith("stale"):  # its record, if any, no longer matches either: it is trained again
        changed = status.removeprefix("stale: ")
        print(f"[reproduce] {label}: started over (its checkpoint differs in {changed})", flush=True)
        status = "absent"
    print(f"[reproduce] {label}" + (" (continued)" if status == "unfinished" else ""), flush=True)
    run_dir, started = run_dir_for(config), time.perf_counter()
    earlier = _wall_time_s(run_dir) if status == "unfinished" else 0.0
    try:
        if status == "unfinished":
            train(config, resume=str(run_dir))
        else:  # a run that never reached a checkpoint starts over
            train(config, overwrite=True)
    finally:  # counted after an error, Ctrl-C or `kill` too (not SIGKILL); one file per run: shards never collide
        if run_dir.is_dir():
            total = earlier + time.perf_counter() - started
            atomic_write_text(run_dir / WALL_TIME_FILE, json.dumps({"seconds": total}) + "\n")


def _wall_time_s(run_dir: Path) -> float:
    path = run_dir / WALL_TIME_FILE
    return json.loads(path.read_text())["seconds"] if path.is_file() else 0.0


# Precondition table columns: (heading, warm-start measure, format: a share in %, nats, a gate).
_PRECONDITIONS = [
    ("random policy", "random_success_rate", "%"),
    ("one-move tasks", "one_action/solved", "%"),
    ("top first move", "one_action/top_move", "%"),
    ("success, no skill", "skills/success/none", "%"),
    ("correct skill", "skills/success/correct", "%"),
    ("wrong skill", "skills/success/wrong", "%"),
    ("gap, won", "skills/gap/won", "nats"),
    ("gate, won", "skills/gate/won", "gate"),
    ("gap, lost", "skills/gap/lost", "nats"),
    ("gate, lost", "skills/gate/lost", "gate"),
    ("gap, won with correct skill", "skills/gap_correct/won", "nats"),
    ("gate, won with correct skill", "skills/gate_correct/won", "gate"),
    ("skill valid", "analyzer/valid", "%"),
    ("agrees", "analyzer/agree", "%"),
    ("agrees, won", "analyzer/agree_won", "%"),
]
# EZPoints has no one-move task: its columns hold the first number of a deal that only the cards decide.
_EZPOINTS_SIGHT = {"one_action/solved": "first_number/solver", "one_action/top_move": "first_number/top_answer"}
_FORMATS = {"%": lambda v: f"{100 * v:.1f}", "nats": lambda v: f"{v:+.3f}", "gate": lambda v: f"{v:.3f}"}


def _precondition_lines(preconditions: dict[str, dict[str, float]], variants: Sequence[str] = ()) -> list[str]:
    """Does the base see, read a skill, and does its self-analyzer write usable ones (docs/TOY.md: the warm
    start). `variants`: tasks whose rows the reproduction measured itself (`measure_task_variant`)."""
    if not preconditions:
        return []

    def cell(value: float | None, kind: str) -> str:
        return "—" if value is None or math.isnan(value) else _FORMATS[kind](value)

    lines = [
        "## Preconditions: does the base policy see, read skills and write them?",
        "",
        "Measured by the warm start on the held-out evaluation tasks before any RL (`warmstart.json`), in %",
        "unless marked: the success of uniformly random admissible actions (the floor a base must clear to be",
        "said to play); on held-out one-move tasks, how often the base's first move is the winning one (25%",
        "is chance: does it see the frame?) and the share of its most frequent first move (a fixed",
        "preference), and on EZPoints the same for the first number of held-out deals of a single solvable",
        f"pair, ranked as the solver answers it (one number for every deal is right on {BLIND_FIRST_NUMBER:.1%} at most);",
        "success with no skill in context, with the correct skill (the",
        "scripted analyzer's for the solver's win on that task) and with a wrong one (another task's); on the",
        "no-skill episodes, the mean teacher-student gap `l_skill - l_old` (nats) and gate on move tokens",
        "(inside `<action>`) with each episode's own scripted hindsight skill (what SEED's teacher sees), scored",
        "at the rollout temperature as the trainer scores, won and lost episodes, and the same on the won",
        "correct-skill episodes with the skill they were played with; and the self-analyzer's",
        "skills on those episodes: usable, and agreeing with the scripted analyzer's content (the winning",
        "order, or a correct solution).",
        *([f"{', '.join(variants)}: measured the same way on the varied task by the reproduction",
           "(`base-<task>.json` beside the run records)."] if variants else []),
        "",
        "| Task | " + " | ".join(heading for heading, _, _ in _PRECONDITIONS) + " |",
        "|---|" + "---|" * len(_PRECONDITIONS),
    ]
    for task, measured in preconditions.items():
        cells = [cell(measured.get(key, measured.get(_EZPOINTS_SIGHT.get(key, ""))), kind)
                 for _, key, kind in _PRECONDITIONS]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def first_reach(curves: list[list[tuple[float, float]]], target: float) -> float:
    """Environment steps at which the seed-mean evaluation curve first reaches `target` (nan: never).

    Evaluations happen at the same update steps in every seed; their environment steps differ, so the
    seed-mean of both is used. A run whose budget ran out an update earlier than another's ends with one
    evaluation fewer: past its end it counts with its final evaluation."""
    for k in range(max(len(c) for c in curves)):
        points = [c[min(k, len(c) - 1)] for c in curves]
        if statistics.fmean(value for _, value in points) >= target - 1e-9:
            return statistics.fmean(steps for steps, _ in points)
    return math.nan


def _mean_std(values: list[float], num_seeds: int | None = None) -> str:
    """Mean ± std in %; `num_seeds`: the seeds planned, named when fewer runs have finished."""
    finished = len(values)
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    partial = f" ({finished} of {num_seeds} seeds)" if num_seeds and finished < num_seeds else ""
    return f"{100 * statistics.fmean(values):.1f} ± {100 * std:.1f}{partial}"


def _method_table_header(tasks: list[str]) -> list[str]:
    return ["| Method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]


def _success_rows(
    methods, tasks, by, statistic: Callable[[RunResult], float], num_seeds: dict[tuple[str, str], int]
) -> list[str]:
    """One table row per method: `statistic` of each run, mean ± std over the finished seeds, per task
    (`—`: a task the method is not planned on)."""

    def cell(t: str, m: str) -> str:
        return _mean_std([statistic(r) for r in by[(t, m)]], num_seeds[(t, m)]) if num_seeds[(t, m)] else "—"

    return [f"| {_method_name(m)} | " + " | ".join(cell(t, m) for t in tasks) + " |" for m in methods]


def _method_name(method: str) -> str:
    return METHODS[method][0]


def write_results(
    cfg: ReproduceConfig,
    results: list[RunResult],
    out: Path,
    minutes: float,
    config_path: str | None,
    overrides: list[str],
    preconditions: dict[str, dict[str, float]] | None = None,
) -> None:
    tasks, methods = list(cfg.tasks), [*cfg.methods, *cfg.single_runs]
    planned = planned_runs(cfg)
    num_seeds = Counter((t, m) for t, m, _ in planned)
    by = {(t, m): [r for r in results if r.task == t and r.method == m] for t in tasks for m in methods}
    command = " ".join(["seed-vl reproduce", *([f"--config {config_path}"] if config_path else []), *overrides])
    lines = [
        "# Toy-scale reproduction: SEED vs GRPO",
        "",
        f"Generated by `{command}` (the warm start and the runs took {minutes:.0f} min on this machine, summed",
        "over runs, which may overlap). Every number below comes from that run;",
        "rerun the command to regenerate this file and the figures, or add `--report-only` to re-render them from",
        f"the finished runs' records in `{Path(cfg.records_dir).as_posix()}/` without training.",
        "",
        "Setup: tiny Qwen2.5-VL-architecture model (built by `seed-vl make-tiny-model`), warm-started as in the README",
        f"(a stand-in for pretraining), then RL with each method from the same base; seeds {cfg.seeds};",
        f"recipes {', '.join(f'`{r}`' for r in cfg.tasks.values())}"
        + (f" with overrides `{' '.join(cfg.overrides)}`" if cfg.overrides else "")
        + (f" and, for the base's warm start, `{' '.join(cfg.warmstart_overrides)}`" if cfg.warmstart_overrides else "")
        + ". Success is the final held-out evaluation (temperature 0.4).",
        "",
    ]
    if len(results) < len(planned):  # a reproduction spread over sessions, rendered half-way
        lines += [
            f"**Partial: {len(results)} of {len(planned)} runs finished.** Cells name how many seeds they average; "
            "the same command continues the other runs.",
            "",
        ]
    lines += [
        "## Final success rate (%, mean ± std over seeds)",
        "",
        *_method_table_header(tasks),
    ]
    lines += _success_rows(methods, tasks, by, lambda r: r.final("eval/success_rate"), num_seeds)
    lines += [
        "",
        "Mean over each run's evaluations after step 0 (less noisy than the final one alone):",
        "",
        *_method_table_header(tasks),
    ]
    lines += _success_rows(methods, tasks, by, lambda r: r.mean_after_start("eval/success_rate"), num_seeds)
    # Step 0 evaluates the shared base with the seed's draws, the same for every method: one value per seed.
    base = {t: list({r.seed: r.records[0].get("eval/success_rate", math.nan) for r in results if r.task == t}.values())
            for t in tasks}
    lines += ["", "Base policy (step-0 evaluation, before RL): " + ", ".join(
        f"{t} {_mean_std(base[t])}" for t in tasks
    ), ""]

    lines += _precondition_lines(preconditions or {}, [t for t in cfg.task_overrides if t in (preconditions or {})])
    lines += [
        "## Environment steps to reach GRPO's final success rate",
        "",
        "First evaluation at which the seed-mean success reaches the seed-mean final success of GRPO "
        "(environment steps, seed-mean; `never` if not reached within the budget).",
        "",
        *_method_table_header(tasks),
    ]
    grpo_final = {
        t: statistics.fmean(r.final("eval/success_rate") for r in by[(t, "grpo")]) if by.get((t, "grpo")) else None
        for t in tasks
    }
    # GRPO ending at or below the base: every method meets its final success before training.
    stalled = {t for t in tasks if grpo_final[t] is not None and grpo_final[t] <= statistics.fmean(base[t]) + 1e-9}
    for m in methods:
        cells = []
        for t in tasks:
            if not num_seeds[(t, m)]:
                cells.append("—")
            elif grpo_final[t] is None or not by[(t, m)]:
                cells.append("n/a")
            elif t in stalled:
                cells.append("base already there")
            else:
                reach = first_reach([r.curve("eval/success_rate") for r in by[(t, m)]], grpo_final[t])
                total = statistics.fmean(r.final("env_steps") for r in by[(t, m)])
                cells.append("never" if math.isnan(reach) else f"{reach:.0f} of {total:.0f}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    if stalled:
        lines += ["", "`base already there`: GRPO's final success is not above the base policy's, so every "
                  "method meets it before training and the comparison says nothing."]

    lines += [
        "",
        "## Diagnostics (mean over training steps and seeds)",
        "",
        "`equal returns`: the share of groups whose returns are all equal (zero advantage: there the OPD term is",
        "the only learning signal).",
        "",
        "| Task | Method | train success | equal returns | analyzer ok | skill words | gate mean | gate > 0.5 "
        "| OPD loss | KL | entropy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tasks:
        for m in (m for m in methods if num_seeds[(t, m)]):
            values = [statistics.fmean([r.mean(k) for r in by[(t, m)]]) if by[(t, m)] else math.nan for k in DIAGNOSTICS]
            lines.append(f"| {t} | {m} | " + " | ".join("—" if math.isnan(v) else f"{v:.3f}" for v in values) + " |")
    lines += ["", "## Learning curves", ""]
    for t in (t for t in tasks if any(by[(t, m)] for m in methods)):  # a task without a finished run: no plot
        figure = os.path.relpath(Path(cfg.figures_dir) / f"reproduce_{t.lower()}.png", out.parent)
        lines.append(f"![{t}]({Path(figure).as_posix()})")
    lines += ["", "## Findings", "", "<!-- findings -->", ""]
    previous = out.read_text() if out.is_file() else ""
    findings = previous.split("<!-- findings -->", 1)[1].strip() if "<!-- findings -->" in previous else ""
    text = "\n".join(lines).replace("<!-- findings -->", "<!-- findings -->\n" + findings if findings else "<!-- findings -->")
    atomic_write_text(out, text.rstrip("\n") + "\n")
    atomic_write_text(out.with_suffix(".json"), json.dumps(
        [{"task": r.task, "method": r.method, "seed": r.seed, "final_success": r.final("eval/success_rate"),
          "env_steps": r.final("env_steps"), "record": r.source.as_posix()} for r in results], indent=1))
