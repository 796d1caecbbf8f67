"""EZPoints core shared by the visual and the text variant (DESIGN §4; RL4VLM's gym_cards game, which is not
on PyPI, rewritten): two cards, build a formula equal to 12 from both card values, one token per step.

Deal (as gym_cards): card 1 has rank 2..13 (J, Q, K count 10); card 2 is worth 12 // v1 with probability 1/2
when v1 divides 12, else 12 - v1; the order is then swapped with probability 1/2. Every deal is solvable.
Since a 10-valued card is drawn 4 times in 12, "2 + 10 =" wins 37.5% of these deals whatever the cards.
`deal="uniform_pair"` (a labelled toy departure from gym_cards, docs/TOY.md): the two values are one of the
seven solvable pairs, each as likely (a 10 dealt as 10, J, Q or K alike), in either order; one formula then
wins 1 deal in 7.

Rules and rewards, as gym_cards' `EZPointEnv.step`:
  * Tokens are 1..10, '+', '*' and '='.
  * Length limit: a step that finds the formula longer than 5 tokens ends the episode (truncated) with -1;
    its token is not applied.
  * Invalid token, -1: a number that is not the value of a card still unused (gym_cards' check), and, since
    a model's output may not parse, no token or a token outside the vocabulary. The formula grows by a blank
    (shown as '_'), as in gym_cards, so repeated invalid tokens reach the length limit; the episode goes on.
  * Any other number, '+' or '*' is appended, reward 0. Nothing checks that the formula stays well formed:
    "6 * 2 +" is a formula too, and it fails at '='.
  * '=' ends the episode: +10 when the tokens, joined, form an expression (numbers, '+', '*') equal to 12
    that uses both cards; -1 otherwise (a wrong value, a malformed formula, a card unused). An early or
    wrong submission therefore costs as much as an invalid token, and ends the episode.
  * Cap (ours, documented): the episode is truncated after `max_steps` (8) steps with reward 0. With the
    length limit above, an episode ends by step 7, so the cap binds only when set lower.
Because the game charges -1 for an invalid token itself, the EZPoints recipes set the trainer's
`algorithm.invalid_action_penalty` to 0: one invalid token costs -1, the same as a wrong submission.
"""

from __future__ import annotations

import ast
import random
from abc import abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from seed_vl.envs.base import Env, EpisodeOver, Hindsight, Observation, StepResult, count, phrase, step_list

TARGET = 12
NUMBERS = tuple(str(n) for n in range(1, 11))
OPERATORS = ("+", "*")
EQUALS = "="
VOCABULARY = (*NUMBERS, *OPERATORS, EQUALS)
MAX_STEPS = 8
MAX_FORMULA_TOKENS = 5  # gym_cards: a step that finds a longer formula ends the episode
WIN_REWARD, LOSS_REWARD = 10.0, -1.0  # LOSS_REWARD: a wrong '=', an invalid token, the length limit
BLANK = " "  # what an invalid token adds to the formula
SUITS = ("hearts", "spades", "diamonds", "clubs")
# Card values a deal can hold (2..10) whose sum or product is 12: (2, 6), (2, 10), (3, 4), ... (6, 6)
SOLVABLE_PAIRS = tuple((a, b) for a in range(2, 11) for b in range(a, 11) if TARGET in (a + b, a * b))
TASK = (
    "EZPoints: build a formula equal to 12 that uses the values of both cards once each (J, Q and K count "
    "as 10); one token per step: a number 1-10, '+' or '*', then '=' to submit."
)

Formula = tuple[str, ...]


@dataclass(frozen=True)
class Card:
    rank: int  # 2..10, 11 = J, 12 = Q, 13 = K
    suit: str

    @property
    def value(self) -> int:
        return min(self.rank, 10)

    @property
    def label(self) -> str:
        return {11: "J", 12: "Q", 13: "K"}.get(self.rank, str(self.rank))

    def describe(self) -> str:
        return f"{self.label} of {self.suit}"


Deal = Literal["gym_cards", "uniform_pair"]


def deal(rng: random.Random, kind: Deal = "gym_cards") -> tuple[Card, Card]:
    """gym_cards' deal, with its draws in the same order, from `rng`; or the `uniform_pair` variant."""
    if kind == "uniform_pair":
        values = rng.choice(SOLVABLE_PAIRS)
        cards = tuple(Card(rng.randint(10, 13) if v == 10 else v, rng.choice(SUITS)) for v in values)
    else:
        first = Card(rng.randint(2, 13), rng.choice(SUITS))
        v = first.value
        second_value = TARGET // v if TARGET % v == 0 and rng.random() <= 0.5 else TARGET - v
        cards = (first, Card(second_value, rng.choice(SUITS)))
    return cards[::-1] if rng.random() <= 0.5 else cards


def is_valid_token(values: Sequence[int], formula: Formula, token: str | None) -> bool:
    """Whether `token` (not '=') is accepted: an operator, or the value of a card still unused."""
    if token in OPERATORS:
        return True
    unused = Counter(values) - Counter(int(t) for t in formula if t in NUMBERS)
    return token in NUMBERS and unused[int(token)] > 0


def evaluate(formula: Formula) -> int | None:
    """The value of the tokens joined into one expression, as gym_cards evaluates it; None when they do not
    form one of integers, '+' and '*' (parsed, never `eval`-ed)."""
    try:
        tree = ast.parse("".join(formula).strip(), mode="eval")
    except SyntaxError:
        return None
    return _value(tree.body)


def _value(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd):
        return _value(node.operand)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _value(node.left), _value(node.right)
        if left is None or right is None:
            return None
        return left + right if isinstance(node.op, ast.Add) else left * right
    return None


def show_formula(formula: Formula) -> str:
    return " ".join("_" if token == BLANK else token for token in formula)


def wins(values: Sequence[int], formula: Formula) -> bool:
    return uses_all_cards(values, formula) and evaluate(formula) == TARGET


def uses_all_cards(values: Sequence[int], formula: Formula) -> bool:
    return sorted(int(t) for t in formula if t in NUMBERS) == sorted(values)


def solve(values: Sequence[int]) -> list[Formula]:
    """Every well-formed winning formula (number, operator, number, ...), by exhaustive search."""
    solutions: list[Formula] = []

    def extend(formula: Formula) -> None:
        if wins(values, formula):
            solutions.append(formula)
        if not formula or formula[-1] in OPERATORS:
            candidates = NUMBERS
        else:  # an operator, while a card is left to follow it
            candidates = OPERATORS if len(values) > sum(t in NUMBERS for t in formula) else ()
        for token in candidates:
            if is_valid_token(values, formula, token):
                extend((*formula, token))

    extend(())
    return solutions


class EZPointsEnv(Env):
    """Episode rules shared by both variants; a subclass only decides what the observation looks like."""

    task = TASK

    def __init__(self, max_steps: int | None = None, deal: Deal = "gym_cards") -> None:
        self.max_steps = max_steps or MAX_STEPS
        self.deal_kind = deal
        self.cards: tuple[Card, Card] | None = None
        self.formula: Formula = ()
        self._steps = 0
        self._done = True

    @property
    def values(self) -> tuple[int, int]:
        return self.cards[0].value, self.cards[1].value

    @abstractmethod
    def _observe(self) -> Observation: ...

    def reset(self, seed: int) -> tuple[Observation, dict[str, Any]]:
        self.cards = deal(random.Random(seed), self.deal_kind)
        self.formula, self._steps, self._done = (), 0, False
        return self._observe(), self._info(action_valid=True, won=False)

    def step(self, action: str | None) -> StepResult:
        if self._done:
            raise EpisodeOver(f"{self.name}: step() on a finished episode; call reset(seed) first")
        self._steps += 1
        won, valid, terminated, truncated = False, True, False, False
        if len(self.formula) > MAX_FORMULA_TOKENS:  # checked before the token, as gym_cards does
            reward, truncated = LOSS_REWARD, True
        elif action == EQUALS:
            won, terminated = wins(self.values, self.formula), True
            reward = WIN_REWARD if won else LOSS_REWARD
        elif is_valid_token(self.values, self.formula, action):
            self.formula, reward = (*self.formula, action), 0.0
        else:
            self.formula, reward, valid = (*self.formula, BLANK), LOSS_REWARD, False
        truncated = truncated or (not terminated and self._steps >= self.max_steps)
        self._done = terminated or truncated
        return self._observe(), reward, terminated, truncated, self._info(action_valid=valid, won=won)

    def _info(self, action_valid: bool, won: bool) -> dict[str, Any]:
        return {
            "won": won,
            "action_valid": action_valid,
            "task": self.task,
            "admissible_actions": list(VOCABULARY),
            "step": self._steps,
            "cards": [c.describe() for c in self.cards],
            "card_values": list(self.values),
            "formula": list(self.formula),  # invalid tokens as BLANK
        }

    def hindsight(self, seed: int, actions: Sequence[str | None], rng: random.Random) -> Hindsight:
        self.reset(seed)
        trace = []
        for action in actions:
            _, _, terminated, truncated, info = self.step(action)
            trace.append((action, info["action_valid"]))
            if terminated or truncated:
                break
        return ezpoints_hindsight(self.cards, self.formula, trace, rng)

    def hindsight_facts(self, seed: int, actions: Sequence[str | None]) -> list[str]:
        self.reset(seed)
        won = False
        for action in actions:
            _, _, terminated, truncated, info = self.step(action)
            won = info["won"]
            if terminated or truncated:
                break
        if won:
            return [show_formula(self.formula)]
        return [" ".join(formula) for formula in solve(self.values)]


# -------------------------------------------------------------------------------------- scripted analyzer
_SUCCESS = (
    "With {cards}, enter {formula} and then '=': {formula} = 12. First check whether the two values add up "
    "to 12 or multiply to 12, then type number, operator, number.",
    "Winning workflow: read both card values ({values}), pick the operator that makes 12 ({formula}), type "
    "it token by token and submit with '='.",
    "Decide the whole formula before typing: {values} -> {formula} = 12, then '='. Remember J, Q and K "
    "count as 10.",
)
_WRONG = (
    "The formula {wrong} gives {value}, not 12. With {cards}, check both operators first: {correct} = 12.",
    "Do not submit {wrong} (= {value}); test '+' and '*' on {values} before pressing '='. The correct "
    "formula was {correct}.",
    "Submitting {wrong} = {value} lost the hand. For {values} the answer is {correct}; compute the result "
    "before '='.",
)
_EARLY = (
    "Pressed '=' on {wrong} without using both cards. Enter the full formula {correct} before '='.",
    "Do not submit an incomplete formula ({wrong}): both card values ({values}) must appear, as in "
    "{correct}, before pressing '='.",
)
_INVALID = (
    "Tokens {tokens} at {steps} were rejected: only the card values {values}, each once, and an operator "
    "between them are allowed. Type {correct} then '='.",
    "Use only the values on the cards ({values}) and alternate number, operator, number: the moves {tokens} "
    "({steps}) were invalid. The winning formula was {correct}.",
)
_MALFORMED = (
    "The formula {wrong} is not a valid expression. Alternate number, operator, number: {correct}, then '='.",
    "Submitting {wrong} lost: numbers and operators must alternate, as in {correct} = 12.",
)
_TOO_LONG = (
    "The formula {wrong} grew past 5 tokens and the hand was lost. Type only {correct}, then '='.",
    "Rejected tokens and extra operators filled the formula {wrong} until it was too long; "
    "for {values} type {correct} and press '='.",
)
_UNFINISHED = (
    "The formula was never submitted: after {wrong} press '='. For {values} the full answer is {correct} "
    "followed by '='.",
    "Ran out of steps without pressing '='. Type {correct} and submit with '=' right away.",
)


def ezpoints_hindsight(
    cards: tuple[Card, Card], formula: Formula, trace: Sequence[tuple[str | None, bool]], rng: random.Random,
) -> Hindsight:
    """A workflow skill for a win; otherwise an avoidance rule naming the mistake (the wrong formula, the
    rejected tokens, the early or missing '=') and a correct formula."""
    values = tuple(c.value for c in cards)
    shown = " and ".join(c.label if c.rank <= 10 else f"{c.label} (worth {c.value})" for c in cards)
    fields = {
        "cards": shown, "values": f"{values[0]} and {values[1]}",
        "wrong": f"'{show_formula(formula)}'" if formula else "an empty formula",
        "formula": show_formula(formula),
        "correct": " ".join(rng.choice(solve(values))),
        "value": evaluate(formula),
    }
    submitted = bool(trace) and trace[-1][0] == EQUALS
    result = f"{fields['wrong']} " + ("submitted" if submitted else "never submitted")
    summary = f"Cards {shown}; {result}; "
    if submitted and wins(values, formula):
        return Hindsight(episode_summary=summary + "won.", episode_skill=phrase(rng, _SUCCESS, **fields))
    invalid = [(k, action) for k, (action, valid) in enumerate(trace, 1) if not valid]
    if submitted and uses_all_cards(values, formula) and fields["value"] is not None:
        skill = phrase(rng, _WRONG, **fields)
    elif submitted and uses_all_cards(values, formula):
        skill = phrase(rng, _MALFORMED, **fields)
    elif invalid:
        tokens = ", ".join("(no answer)" if a is None else repr(a) for _, a in invalid)
        skill = phrase(rng, _INVALID, tokens=tokens, steps=step_list([k for k, _ in invalid]), **fields)
    elif submitted:
        skill = phrase(rng, _EARLY, **fields)
    elif len(formula) > MAX_FORMULA_TOKENS:
        skill = phrase(rng, _TOO_LONG, **fields)
    else:
        skill = phrase(rng, _UNFINISHED, **fields)
    summary += f"lost ({count(len(invalid), 'invalid token')})."
    return Hindsight(episode_summary=summary, episode_skill=skill)
