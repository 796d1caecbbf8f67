"""scripts/first_moves.py on a hand-built run: first moves counted per window, with their gates by outcome, and
(with the run's config) how often the environment accepts them on their own task and on the others."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from helpers import write_trajectory_step

from seed_vl.envs.ezpoints import deal

ROOT = Path(__file__).resolve().parents[1]
TOKENS = ["<think>", "go", "</think>", "<action>", "MOVE", "</action>"]


def _record(won: bool, first: str | None, gate: float | None, seed: int = 0) -> dict:
    tokens = [t.replace("MOVE", first or "?") for t in TOKENS]
    turn = {"response_text": "".join(tokens), "response_ids": list(range(len(tokens))), "response_tokens": tokens,
            "action": first, "action_valid": first is not None, "reward": 0.0,
            "gates": None if gate is None else [0.5, 0.5, 0.5, 0.5, gate, 0.5]}
    return {"seed": seed, "group_id": 0, "won": won, "episode_return": 0.0, "turns": [turn, dict(turn, gates=None)]}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "first_moves.py"), *args],
                          capture_output=True, text=True)


def test_counts_first_moves_and_their_gates_by_outcome_in_each_window(tmp_path):
    write_trajectory_step(tmp_path, 1, [_record(True, "5", 0.9), _record(False, "2", 0.1), _record(False, None, None)])
    write_trajectory_step(tmp_path, 2, [_record(True, "2", 0.2), _record(False, "2", 0.4), _record(True, "2", None)])

    first = _run(str(tmp_path), "--steps", "1").stdout
    assert "update steps 1, episodes 3, first moves: '5' 1 (won 1), '2' 1 (won 0), '(none)' 1 (won 0)" in first
    assert "first move's gate, won: mean 0.900, open 1.000 (1 tokens)" in first
    assert "first move's gate, lost: mean 0.100, open 0.000 (1 tokens)" in first  # the unparsed move has no gate

    last = _run(str(tmp_path), "--last", "1").stdout
    assert "update steps 1, episodes 3, first moves: '2' 3 (won 2)" in last
    assert "first move's gate, won: mean 0.200, open 0.000 (1 tokens)" in last  # only turn 1, only move tokens
    assert "first move's gate, lost: mean 0.400, open 0.000 (1 tokens)" in last

    both = _run(str(tmp_path), "--top", "1").stdout
    assert "update steps 2, episodes 6, first moves: '2' 4 (won 2)\n" in both


def test_first_moves_accepted_on_their_own_task_and_on_the_others(tmp_path):
    (tmp_path / "config.yaml").write_text("env:\n  name: ezpoints_text\n")
    values = {seed: {c.value for c in deal(random.Random(seed))} for seed in range(50)}
    a, b = next((a, b) for a in values for b in values if not values[a] & values[b])
    card_a, card_b = (str(min(values[s])) for s in (a, b))
    write_trajectory_step(tmp_path, 1, [_record(False, card_a, None, a), _record(False, card_b, None, b),
                                        _record(False, "+", None, a)])
    # Own task: all three accepted; on the other task: each card refused, the operator accepted (1 of 3).
    assert "first move accepted: 100.0% on its own task, 33.3% on the window's other tasks" in _run(str(tmp_path)).stdout


def test_a_directory_without_trajectories_or_an_empty_window_is_an_error(tmp_path):
    result = _run(str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0 and "trajectories" in result.stderr
    result = _run(str(tmp_path), "--last", "0")
    assert result.returncode == 2 and "argument --last: must be at least 1 (got 0)" in result.stderr
