"""Model output -> action. The one accepted format (DESIGN §4) is

    <think>reasoning</think><action>one action</action>

with nothing but whitespace around the two blocks. Anything else - a missing think block, a missing or
repeated tag, text after the action, markup or control characters inside the action, an output longer than
`MAX_RESPONSE_CHARS` - is an invalid action. `parse_action` never raises, so model output cannot crash a
rollout.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from seed_vl.processors.prompts import one_line

MAX_RESPONSE_CHARS = 8192  # a longer output is invalid without being scanned (bounded time)
MAX_ACTION_CHARS = 200
TAGS = ("<think>", "</think>", "<action>", "</action>")
_ANSWER = re.compile(r"\s*<think>.*</think>\s*<action>(?P<action>.*)</action>\s*", re.DOTALL)


def parse_action(text: str, admissible: Sequence[str] | None = None) -> tuple[str | None, bool]:
    """(action, valid) for a model output.

    `action` is None when the output does not follow the format; otherwise it is the action with its
    whitespace collapsed - spelled as in `admissible` when it matches an entry case-insensitively, else
    case-folded. `valid` is True only for a well-formed answer whose action is in `admissible` (any
    well-formed, printable action when `admissible` is None).
    """
    action = _extract(text)
    if action is None:
        return None, False
    if admissible is None:
        return action.casefold(), True
    canonical = {one_line(a).casefold(): a for a in admissible}
    key = action.casefold()
    return (canonical[key], True) if key in canonical else (key, False)


def _extract(text: object) -> str | None:
    """The normalized action of a well-formed answer, else None."""
    if not isinstance(text, str) or len(text) > MAX_RESPONSE_CHARS:
        return None
    if any(text.count(tag) != 1 for tag in TAGS):
        return None
    match = _ANSWER.fullmatch(text)
    if match is None:
        return None
    action = one_line(match["action"])
    if not action or len(action) > MAX_ACTION_CHARS or not action.isprintable() or "<" in action:
        return None
    return action

