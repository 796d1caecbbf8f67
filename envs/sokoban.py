"""Sokoban core shared by the visual and the text variant (DESIGN §4): state and moves, gym-sokoban's room
generator driven by seeded generators, an optimal BFS solver, the episode rules and the scripted analyzer.

Rules: actions up/down/left/right (walking into a box pushes it when the cell beyond is free); -0.1 per
step, +1 when a box reaches a target, -1 when one leaves a target, +10 when every box is on a target
(terminated); an invalid action (None, anything outside the four moves) costs -0.1 and does not move;
the episode is truncated after `max_steps` (15) steps. With `end_on_deadlock` (off by default, as in the
paper's environment; on in the toy recipes) a push after which no move sequence can solve the room ends the
episode, lost: its success is the same, but no turn is spent in a room that can no longer be won.
With `min_solution_moves` (0 by default, as in the paper's environment), a task whose room is solved in
fewer moves gets another room (drawn from its seed): a measure on rooms of 3+ moves is not diluted by the
rooms of one or two moves (half of the default draw) that the toy's warm-started base already wins.
"""

from __future__ import annotations

import functools
import random
from abc import abstractmethod
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from seed_vl.config import ConfigError
from seed_vl.envs.base import (
    Env,
    EpisodeOver,
    Hindsight,
    Observation,
    StepResult,
    count,
    phrase,
    step_list,
    step_route,
)

Cell = tuple[int, int]

ACTIONS = ("up", "down", "left", "right")
DELTAS: dict[str, Cell] = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}

MAX_STEPS = 15
SEARCH_DEPTH = 30  # reverse-play depth of the room generator (the reference runs' setting)
STEP_REWARD = -0.1
BOX_ON_TARGET_REWARD = 1.0  # and -1 for pushing a box off a target
SOLVED_REWARD = 10.0

# gym-sokoban's room encoding, which is also the order of its sprite files (see `tile_codes`).
WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET = range(7)
# Text grid, indexed by that code: XSB notation with "_" for floor (a space is invisible to a reader).
SYMBOLS = "#_.*$@+"
TEXT_LEGEND = "# wall, _ floor, . target, $ box, * box on a target, @ you, + you on a target"


@dataclass(frozen=True)
class SokobanState:
    """A room (its floor cells and targets) and its movable parts. Immutable: a move returns a new state."""

    shape: tuple[int, int]
    floor: frozenset[Cell]  # every cell that is not a wall
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    @property
    def boxes_on_target(self) -> int:
        return len(self.boxes & self.targets)

    def move(self, action: str) -> tuple[SokobanState, bool, bool]:
        """(next state, player moved, box pushed). Blocked moves leave the state unchanged."""
        step = _push_or_walk(self.floor, self.player, self.boxes, DELTAS[action])
        if step is None:
            return self, False, False
        player, boxes, pushed = step
        return replace(self, player=player, boxes=boxes), True, pushed

    def tile_codes(self) -> np.ndarray:
        """(H, W) array in gym-sokoban's encoding, player on a target = 6 (its renderer's extra code)."""
        codes = np.full(self.shape, WALL, dtype=np.intp)
        for cells, code in ((self.floor, FLOOR), (self.targets, TARGET)):
            rows, cols = zip(*cells, strict=True)
            codes[rows, cols] = code
        for r, c in self.boxes:
            codes[r, c] = BOX_ON_TARGET if (r, c) in self.targets else BOX
        codes[self.player] = PLAYER_ON_TARGET if self.player in self.targets else PLAYER
        return codes

    def to_text(self) -> str:
        return "\n".join("".join(SYMBOLS[code] for code in row) for row in self.tile_codes())

    @classmethod
    def from_text(cls, text: str) -> SokobanState:
        """Parse an XSB grid ('#', '_' / '-' / ' ' floor, '.', '$', '*', '@', '+'); cells outside the grid
        count as walls."""
        rows = [row for row in text.splitlines() if row.strip()]
        floor, targets, boxes, players = set(), set(), set(), []
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch not in "#_- .$*@+":
                    raise ValueError(f"sokoban grid: unknown symbol {ch!r} at row {r}, column {c}")
                if ch != "#":
                    floor.add((r, c))
                if ch in ".*+":
                    targets.add((r, c))
                if ch in "$*":
                    boxes.add((r, c))
                if ch in "@+":
                    players.append((r, c))
        if len(players) != 1 or not boxes or len(boxes) != len(targets):
            raise ValueError("sokoban grid: needs one player and as many boxes as targets (at least one)")
        shape = (len(rows), max(len(row) for row in rows))
        return cls(shape, frozenset(floor), frozenset(targets), frozenset(boxes), players[0])


def _push_or_walk(
    floor: frozenset[Cell], player: Cell, boxes: frozenset[Cell], delta: Cell
) -> tuple[Cell, frozenset[Cell], bool] | None:
    """gym-sokoban's move rule: walk onto a free cell, or push the box ahead if the cell beyond is free."""
    ahead = (player[0] + delta[0], player[1] + delta[1])
    if ahead not in floor:
        return None
    if ahead not in boxes:
        return ahead, boxes, False
    beyond = (ahead[0] + delta[0], ahead[1] + delta[1])
    if beyond not in floor or beyond in boxes:
        return None
    return ahead, (boxes - {ahead}) | {beyond}, True


# ----------------------------------------------------------------------------------------------- generator
# A port of gym-sokoban's `generate_room` (random-walk topology, random player and targets, then reverse
# play: pull the boxes away from their targets and keep the state that scores highest). The original draws
# from Python's and NumPy's *global* generators and keeps its search in module globals; this one draws the
# same numbers, in the same order, from generators seeded by `seed`, and keeps its search local - so it is
# reproducible, thread-safe and leaves the global states alone.
_WALK_DIRECTIONS = [(1, 0), (0, 1), (-1, 0), (0, -1)]
_WALK_MASKS = [
    np.array(mask)
    for mask in (
        [[0, 0, 0], [1, 1, 1], [0, 0, 0]],
        [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [0, 1, 0]],
        [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
        [[0, 0, 0], [0, 1, 1], [0, 1, 0]],
    )
]
_PULL_DIRECTIONS = [DELTAS[a] for a in ACTIONS]  # gym-sokoban's CHANGE_COORDINATES order
_MAX_EXPLORED_STATES = 300_000
_MAX_GENERATION_ATTEMPTS = 1000  # a guard against rooms too small to ever work


@functools.lru_cache(maxsize=2048)
def generate_room(
    seed: int, shape: tuple[int, int] = (6, 6), num_boxes: int = 1, search_depth: int = SEARCH_DEPTH,
) -> SokobanState:
    """The room for `seed` (cached: every member of a group and every replay asks for the same rooms)."""
    if not 0 <= seed < 2**32:
        raise ValueError(f"sokoban seed must be in [0, 2**32), got {seed}")
    if min(shape) < 3:
        raise ConfigError(f"env.dim_room: a Sokoban room needs at least 3x3 cells (got {shape})")
    py_rng, np_rng = random.Random(seed), np.random.RandomState(seed)
    num_walk_steps = int(1.7 * (shape[0] + shape[1]))
    for _ in range(_MAX_GENERATION_ATTEMPTS):  # gym-sokoban retries until reverse play moved the boxes
        room = _random_walk_topology(shape, num_walk_steps, py_rng)
        cells = [(int(r), int(c)) for r, c in zip(*np.nonzero(room), strict=True)]  # row-major, as gym's
        if len(cells) <= num_boxes + 1:
            continue
        free = list(cells)
        player = free.pop(np_rng.randint(len(free)))
        targets = frozenset(free.pop(np_rng.randint(len(free))) for _ in range(num_boxes))
        floor = frozenset(cells)
        score, player, boxes = _reverse_play(floor, targets, player, search_depth)
        if score > 0:
            return SokobanState(shape, floor, targets, boxes, player)
    raise ConfigError(
        f"env.dim_room={shape} with env.num_boxes={num_boxes}: no solvable room in "
        f"{_MAX_GENERATION_ATTEMPTS} attempts; use a larger room or fewer boxes"
    )


@functools.lru_cache(maxsize=2048)
def task_room(
    seed: int, shape: tuple[int, int], num_boxes: int, search_depth: int, min_solution_moves: int = 0
) -> SokobanState:
    """Task `seed`'s room: `generate_room(seed)`, redrawn from a generator seeded with `seed` while its
    shortest solution is under `min_solution_moves` moves (still one room per seed, for every episode)."""
    room, rng = generate_room(seed, shape, num_boxes, search_depth), random.Random(seed)
    for _ in range(_MAX_GENERATION_ATTEMPTS):
        if not min_solution_moves or len(solve(room)) >= min_solution_moves:
            return room
        room = generate_room(rng.randrange(2**32), shape, num_boxes, search_depth)
    raise ConfigError(
        f"env.min_solution_moves={min_solution_moves}: no room of env.dim_room={shape} with env.num_boxes="
        f"{num_boxes} needs that many moves in {_MAX_GENERATION_ATTEMPTS} draws; lower it"
    )


def _random_walk_topology(shape: tuple[int, int], num_steps: int, rng: random.Random) -> np.ndarray:
    height, width = shape
    direction = rng.choice(_WALK_DIRECTIONS)
    position = np.array([rng.randint(1, height - 1), rng.randint(1, width - 1)])
    level = np.zeros(shape, dtype=int)
    for _ in range(num_steps):
        if rng.random() < 0.35:
            direction = rng.choice(_WALK_DIRECTIONS)
        position = np.clip(position + direction, 1, [height - 2, width - 2])
        mask = rng.choice(_WALK_MASKS)
        level[position[0] - 1 : position[0] + 2, position[1] - 1 : position[1] + 2] += mask
    level = (level > 0).astype(int)
    level[[0, -1], :] = 0
    level[:, [0, -1]] = 0
    return level


def _reverse_play(floor: frozenset[Cell], targets: frozenset[Cell], player: Cell, search_depth: int):
    """Depth-first reverse play from the solved room. A state scores (pulls on the path) x (summed box
    distance to its own target), and 0 unless every target is uncovered; the first best state wins. As in
    the original, a state is the grid, in which a box that has ever been pulled looks different."""
    explored: set[tuple[Cell, frozenset[Cell], frozenset[Cell]]] = set()
    best: list[Any] = [-1, player, targets]

    def search(player: Cell, box_at: dict[Cell, Cell], pulled: frozenset[Cell], pulls: int, ttl: int) -> None:
        ttl -= 1
        boxes = frozenset(box_at.values())
        key = (player, boxes, frozenset(box_at[t] for t in pulled))
        if ttl <= 0 or len(explored) >= _MAX_EXPLORED_STATES or key in explored:
            return
        explored.add(key)
        uncovered = not (targets & boxes) and player not in targets
        distance = sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t, b in box_at.items())
        score = pulls * distance if uncovered else 0
        if score > best[0]:
            best[:] = [score, player, boxes]
        for pull in (True, False):
            for dr, dc in _PULL_DIRECTIONS:
                ahead = (player[0] + dr, player[1] + dc)
                if ahead not in floor or ahead in boxes:
                    continue
                behind = (player[0] - dr, player[1] - dc)
                if pull and behind in boxes:
                    target = next(t for t, b in box_at.items() if b == behind)
                    search(ahead, {**box_at, target: player}, pulled | {target}, pulls + 1, ttl)
                else:
                    search(ahead, box_at, pulled, pulls, ttl)

    search(player, {t: t for t in sorted(targets)}, frozenset(), 0, search_depth)
    return best[0], best[1], best[2]


# ------------------------------------------------------------------------------------------------- solver
def solve(state: SokobanState, actions: Sequence[str] = ACTIONS) -> list[str] | None:
    """A shortest move list that puts every box on a target (BFS over player and box cells), or None when
    no move sequence solves the room. Boxes pushed onto dead cells (from which no push sequence reaches a
    target) are pruned, which keeps the search exact and optimal. `actions` orders the moves tried: among
    shortest plans, another order finds another one."""
    if state.solved:
        return []
    live = _live_cells(state.floor, state.targets)
    if not state.boxes <= live:
        return None
    start = (state.player, state.boxes)
    parent: dict[tuple[Cell, frozenset[Cell]], tuple[Any, str] | None] = {start: None}
    frontier = deque([start])
    while frontier:
        node = frontier.popleft()
        for action in actions:
            step = _push_or_walk(state.floor, node[0], node[1], DELTAS[action])
            if step is None:
                continue
            player, boxes, pushed = step
            child = (player, boxes)
            if child in parent or (pushed and not boxes <= live):
                continue
            parent[child] = (node, action)
            if boxes <= state.targets:
                return _path_to(child, parent)
            frontier.append(child)
    return None


def is_deadlocked(state: SokobanState) -> bool:
    """True when no move sequence can solve the room any more (e.g. a box pushed into a corner)."""
    return solve(state) is None


def _live_cells(floor: frozenset[Cell], targets: frozenset[Cell]) -> frozenset[Cell]:
    """Cells from which a lone box can be pushed onto some target: pull boxes backwards from the targets."""
    live, queue = set(targets), deque(targets)
    while queue:
        r, c = queue.popleft()
        for dr, dc in DELTAS.values():
            box, player = (r - dr, c - dc), (r - 2 * dr, c - 2 * dc)
            if box in floor and player in floor and box not in live:
                live.add(box)
                queue.append(box)
    return frozenset(live)


def _path_to(node, parent) -> list[str]:
    actions = []
    while parent[node] is not None:
        node, action = parent[node]
        actions.append(action)
    return actions[::-1]


# ------------------------------------------------------------------------------------------- environment
class SokobanEnv(Env):
    """Episode rules shared by both variants; a subclass only decides what the observation looks like."""

    def __init__(
        self, dim_room: tuple[int, int] = (6, 6), num_boxes: int = 1, max_steps: int | None = None,
        search_depth: int = SEARCH_DEPTH, end_on_deadlock: bool = False, min_solution_moves: int = 0,
    ) -> None:
        self.dim_room = tuple(dim_room)
        self.num_boxes = num_boxes
        self.max_steps = max_steps or MAX_STEPS
        self.search_depth = search_depth
        self.end_on_deadlock = end_on_deadlock
        self.min_solution_moves = min_solution_moves
        goal = "the box onto the target" if num_boxes == 1 else f"all {num_boxes} boxes onto the targets"
        self.task = (
            f"Sokoban: push {goal} in the {self.dim_room[0]}x{self.dim_room[1]} room within {self.max_steps} "
            "moves; each move is up, down, left or right."
        )
        self.state: SokobanState | None = None
        self._steps = 0
        self._done = True

    @abstractmethod
    def _observe(self) -> Observation: ...

    def reset(self, seed: int) -> tuple[Observation, dict[str, Any]]:
        self.state = task_room(seed, self.dim_room, self.num_boxes, self.search_depth, self.min_solution_moves)
        self._steps, self._done = 0, False
        return self._observe(), self._info(action_valid=True, moved=False, pushed=False)

    def step(self, action: str | None) -> StepResult:
        if self._done:
            raise EpisodeOver(f"{self.name}: step() on a finished episode; call reset(seed) first")
        self._steps += 1
        valid = action in ACTIONS
        reward, moved, pushed = STEP_REWARD, False, False
        if valid:
            before = self.state
            self.state, moved, pushed = before.move(action)
            reward += BOX_ON_TARGET_REWARD * (self.state.boxes_on_target - before.boxes_on_target)
            reward += SOLVED_REWARD if self.state.solved else 0.0
        # Only a push can make a room unsolvable, so only a push pays for the check.
        deadlocked = self.end_on_deadlock and pushed and is_deadlocked(self.state)
        terminated = self.state.solved or deadlocked
        truncated = not terminated and self._steps >= self.max_steps
        self._done = terminated or truncated
        info = self._info(action_valid=valid, moved=moved, pushed=pushed)
        return self._observe(), reward, terminated, truncated, info

    def _info(self, action_valid: bool, moved: bool, pushed: bool) -> dict[str, Any]:
        return {
            "won": self.state.solved,
            "action_valid": action_valid,
            "task": self.task,
            "admissible_actions": list(ACTIONS),
            "step": self._steps,
            "boxes_on_target": self.state.boxes_on_target,
            "moved": moved,
            "pushed_box": pushed,
        }

    def hindsight(self, seed: int, actions: Sequence[str | None], rng: random.Random) -> Hindsight:
        self.reset(seed)
        start, trace = self.state, []
        for action in actions:
            _, _, terminated, truncated, info = self.step(action)
            moved, pushed = info["moved"], info["pushed_box"]
            trace.append(SokobanTurn(action, info["action_valid"], moved, pushed, self.state))
            if terminated or truncated:
                break
        return sokoban_hindsight(start, trace, rng)

    def hindsight_facts(self, seed: int, actions: Sequence[str | None]) -> list[str]:
        self.reset(seed)
        start, moves = self.state, []
        for action in actions:
            _, _, terminated, truncated, info = self.step(action)
            moves.append(action if info["action_valid"] else None)
            if terminated or truncated:
                break
        if self.state.solved:
            return [step_route(moves)]
        plan = solve(start)
        return [] if plan is None else [step_route(plan)]


# -------------------------------------------------------------------------------------- scripted analyzer
@dataclass(frozen=True)
class SokobanTurn:
    action: str | None
    valid: bool
    moved: bool
    pushed: bool
    state: SokobanState  # after the move


_SUCCESS = (
    "Get to the side of the box opposite the target before pushing; the winning route here was {route} "
    "({n} moves).",
    "Winning order: {route}. Walk around the box first so that every push moves it straight toward the "
    "target.",
    "Plan the pushes before walking: the moves {route} put every box on its target in {n} moves.",
)
_STUCK = (
    "Never push a box {where} as the {direction} push at step {k} did: from there it cannot reach a target. "
    "Check the cell beyond the box before each push.",
    "At step {k} pushing {direction} moved the box {where} and the room became unsolvable; keep boxes away "
    "from walls and corners that hold no target.",
    "Warning sign: a push that moves the box {where}. The {direction} push at step {k} did that and lost the "
    "episode; the shortest solution from the start was {plan}.",
)
_BUMPS = (
    "Do not walk into walls: {steps} ({moves}) did not move you at all. Plan the route first; the shortest "
    "solution was {plan}.",
    "{count} of {n} moves were wasted against walls or stuck boxes ({steps}). Read the grid before moving; "
    "this room is solved by {plan}.",
    "Moves that hit a wall ({steps}) used up the move budget. Follow open floor instead: {plan}.",
)
_INVALID = (
    "Answer with exactly one of up, down, left, right: {count} ({steps}) did not name a move. "
    "The solution here was {plan}.",
    "{count} ({steps}) went to answers that are not a move; always end with one valid direction. "
    "This room needed {plan}.",
)
_DETOUR = (
    "Ran out of moves after {n} steps without solving. Take the shortest route: {plan} ({m} moves): get "
    "behind the box, then push.",
    "Too many detours: {n} moves did not finish the room, although {m} suffice ({plan}). Move toward the "
    "push position directly.",
)


def winning_skill(moves: Sequence[str | None], rng: random.Random) -> str:
    """A solved room's workflow skill: `moves` (None for a turn without a valid move) quoted as a route, in
    one of several phrasings."""
    return phrase(rng, _SUCCESS, route=step_route(moves), n=len(moves))


def sokoban_hindsight(start: SokobanState, trace: Sequence[SokobanTurn], rng: random.Random) -> Hindsight:
    """A workflow skill for a solved room; otherwise an avoidance rule naming the mistake: the push that
    made the room unsolvable, else the moves wasted against walls, else invalid answers, else detours."""
    plan = solve(start)
    moves = [t.action if t.valid else None for t in trace]  # invalid turns keep their step numbers
    room = f"{start.shape[0]}x{start.shape[1]} room with {count(len(start.boxes), 'box', 'es')}"
    n, m = len(trace), len(plan)
    if trace and trace[-1].state.solved:
        verdict = "optimal" if n == m else f"the shortest solution takes {m}"
        summary = f"Solved the {room} in {n} steps ({verdict})."
        skill = winning_skill(moves, rng)
        return Hindsight(episode_summary=summary, episode_skill=skill)

    plan_text = step_route(plan)
    pushes = sum(t.pushed for t in trace)
    summary = f"Failed the {room}: {count(n, 'step')}, {count(pushes, 'push', 'es')}, not solved."
    stuck = next((k for k, t in enumerate(trace, 1) if t.pushed and is_deadlocked(t.state)), None)
    bumps = [k for k, t in enumerate(trace, 1) if t.valid and not t.moved]
    invalid = [k for k, t in enumerate(trace, 1) if not t.valid]
    if stuck is not None:
        turn = trace[stuck - 1]
        where = _where(turn.state, turn.action)
        skill = phrase(rng, _STUCK, where=where, direction=turn.action, k=stuck, plan=plan_text)
        summary += f" The {turn.action} push at step {stuck} made the room unsolvable."
    elif bumps:
        bumped = ", ".join(trace[k - 1].action for k in bumps)
        skill = phrase(
            rng, _BUMPS, steps=step_list(bumps), moves=bumped, count=len(bumps), n=n, plan=plan_text
        )
        summary += f" {count(len(bumps), 'move')} ran into a wall or a blocked box."
    elif invalid:
        turns = count(len(invalid), "turn")
        skill = phrase(rng, _INVALID, count=turns, steps=step_list(invalid), plan=plan_text)
        summary += f" {count(len(invalid), 'answer')} did not name a move."
    else:
        skill = phrase(rng, _DETOUR, n=n, m=m, plan=plan_text)
    return Hindsight(episode_summary=summary, episode_skill=skill)


_SIDES = {"up": "top", "down": "bottom", "left": "left", "right": "right"}


def _where(state: SokobanState, push: str) -> str:
    """Where the box that `push` just moved ended up: 'into the top-left corner', 'against the top wall'..."""
    dr, dc = DELTAS[push]
    r, c = state.player[0] + dr, state.player[1] + dc
    walls = [_SIDES[d] for d, (wr, wc) in DELTAS.items() if (r + wr, c + wc) not in state.floor]
    vertical = [side for side in walls if side in ("top", "bottom")]
    horizontal = [side for side in walls if side in ("left", "right")]
    if vertical and horizontal:
        return f"into the {vertical[0]}-{horizontal[0]} corner"
    if walls:
        return f"against the {walls[0]} wall"
    return "into a position from which no target can be reached"
