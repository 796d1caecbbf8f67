"""scripts/action_sequences.py on a hand-built run: whole action sequences, rejected moves in brackets, with
their wins, mean return and each turn's mean move gate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import write_trajectory_step

ROOT = Path(__file__).resolve().parents[1]


def _turn(move: str | None, valid: bool, gate: float | None) -> dict:
    tokens = ["<think>", "go", "</think>", "<action>", move or "?", "</action>"]
    return {"response_text": "".join(tokens), "response_ids": list(range(len(tokens))), "response_tokens": tokens,
            "action": move, "action_valid": valid, "reward": 0.0,
            "gates": None if gate is None else [0.5, 0.5, 0.5, 0.5, gate, 0.5]}


def _record(won: bool, episode_return: float, *turns: dict) -> dict:
    return {"seed": 0, "group_id": 0, "won": won, "episode_return": episode_return, "turns": list(turns)}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "action_sequences.py"), *args],
                          capture_output=True, text=True)


def test_counts_sequences_with_rejected_moves_bracketed_and_gates_per_turn(tmp_path):
    write_trajectory_step(tmp_path, 1, [
        _record(False, -3.0, _turn("2", False, 0.4), _turn("+", True, 0.6), _turn("10", False, 0.0)),
        _record(False, -3.0, _turn("2", False, 0.2), _turn("+", True, None), _turn("10", False, 0.1)),
        _record(True, 10.0, _turn("2", True, 0.9), _turn("+", True, 0.5), _turn("10", True, 0.7)),
    ])
    write_trajectory_step(tmp_path, 2, [_record(False, -2.0, _turn(None, False, None), _turn("+", True, None))])

    first = _run(str(tmp_path), "--steps", "1").stdout
    assert "update steps 1, episodes 3\n" in first
    assert ("  '[2] + [10]': 2 episodes, won 0, mean return -3.00, move gates 0.300 0.600 0.050\n"
            "  '2 + 10': 1 episodes, won 1, mean return 10.00, move gates 0.900 0.500 0.700\n") in first

    last = _run(str(tmp_path), "--last", "1").stdout
    assert "  '[?] +': 1 episodes, won 0, mean return -2.00, move gates — —\n" in last  # no skill, no gates

    top = _run(str(tmp_path), "--top", "1").stdout
    assert "update steps 2, episodes 4\n" in top and top.count("episodes, won") == 1


def test_a_directory_without_trajectories_or_a_bad_top_is_an_error(tmp_path):
    result = _run(str(tmp_path))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0 and "trajectories" in result.stderr
    result = _run(str(tmp_path), "--top", "0")
    assert result.returncode == 2 and "--top must be at least 1 (got 0)" in result.stderr
