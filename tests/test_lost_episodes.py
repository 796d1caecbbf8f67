"""scripts/lost_episodes.py on a hand-built run: replays lost episodes from their seeds with the real env."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

from helpers import write_trajectory_step

from seed_vl.config import Config, save_config
from seed_vl.envs.sokoban import ACTIONS, generate_room, is_deadlocked

ROOT = Path(__file__).resolve().parents[1]


def _turn(action: str) -> dict:
    return {"response_text": f"<action>{action}</action>", "response_ids": [1], "action": action,
            "action_valid": True, "reward": -0.1}


def _record(seed: int, won: bool, actions: list[str]) -> dict:
    return {"seed": seed, "group_id": 0, "won": won, "episode_return": 0.0, "turns": [_turn(a) for a in actions]}


def _second_move_deadlocks() -> tuple[int, list[str]]:
    """A room and two moves: the first leaves it solvable, the second pushes the box into a deadlock."""
    for seed in range(100):
        for a, b in itertools.product(ACTIONS, repeat=2):
            first = generate_room(seed, (6, 6), 1, 30).move(a)[0]
            if not is_deadlocked(first) and is_deadlocked(first.move(b)[0]):
                return seed, [a, b]
    raise AssertionError("no such room in 100 seeds")


def test_counts_the_move_that_made_a_lost_room_unsolvable_and_the_turns_after_it(tmp_path):
    config = Config.model_validate({"env": {"name": "sokoban_text"}})
    deadly_seed, deadly = _second_move_deadlocks()
    walk = next((seed, a) for seed in range(100) for a in ACTIONS
                if (s := generate_room(seed, (6, 6), 1, 30).move(a))[1] and not s[2])
    records = [
        _record(deadly_seed, False, [*deadly, "up", "down"]),  # unsolvable at move 2, then 2 wasted turns
        _record(walk[0], False, [walk[1]]),                      # lost (truncated here), still solvable
        _record(walk[0], True, [walk[1]]),                       # won episodes are not replayed
    ]
    write_trajectory_step(tmp_path, 1, records)
    save_config(config, tmp_path / "config.yaml")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "lost_episodes.py"), str(tmp_path)],
                         capture_output=True, text=True, check=True).stdout
    assert "episodes 3, lost 2, lost, room made unsolvable 1, share of lost 0.5" in out
    assert "mean move that made it unsolvable 2," in out and "lost turns after it 0.4" in out  # 2 of 5 turns


def test_a_run_that_is_not_sokoban_is_a_one_line_error(tmp_path):
    save_config(Config.model_validate({"env": {"name": "ezpoints_text"}}), tmp_path / "config.yaml")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "lost_episodes.py"), str(tmp_path)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0 and "not a Sokoban run" in result.stderr


def test_success_is_counted_by_the_rooms_shortest_solution(tmp_path):
    # A room that one move solves has a shortest solution of 1 (no room starts solved).
    seed, move = next((seed, a) for seed in range(200) for a in ACTIONS
                      if generate_room(seed, (6, 6), 1, 30).move(a)[0].solved)
    # Update 1 won that room, update 2 lost it.
    other = "up" if move != "up" else "down"
    for step, record in enumerate([_record(seed, True, [move]), _record(seed, False, [other])], 1):
        write_trajectory_step(tmp_path, step, [record])
    save_config(Config.model_validate({"env": {"name": "sokoban_text"}}), tmp_path / "config.yaml")

    def run(*flags: str) -> str:
        return subprocess.run([sys.executable, str(ROOT / "scripts" / "lost_episodes.py"), str(tmp_path), *flags],
                              capture_output=True, text=True, check=True).stdout

    assert "won by shortest solution: 1 moves 1/2\n" in run()
    assert "won by shortest solution: 1 moves 0/1\n" in run("--last", "1")
    assert "won by shortest solution: 1 moves 1/1\n" in run("--steps", "1")
