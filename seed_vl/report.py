"""Trajectory report: one step of a run as a single HTML file that opens straight from disk (DESIGN §2,
visual debugging). Per episode: the frames (or observation text) in order, each turn's think text, action
and reward, the analyzer's skill, and the response tokens colored by their OPD gate (value on hover).

Reads what the trainer writes under `RUN_DIR/trajectories/step_NNNNNN/` (`seed_vl.rollout.save_trajectories`):
`trajectories.jsonl` and `frames/<frame_id>.png`. Everything is inlined (frames as PNG data URIs, CSS), and
all model text is escaped: it is arbitrary.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
import re
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from seed_vl.config import ConfigError
from seed_vl.io import atomic_write_bytes, atomic_write_text

STEP_DIR = re.compile(r"step_(\d+)")
FRAME_ID = re.compile(r"[\w-]+")  # a frame id names a file inside frames/: never a path
THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
GATE_RGB = (76, 175, 80)  # a gate of 1; a gate of 0 is white
ANALYZER_STATUSES = ("ok", "no_skill", "error", "pending")
GIF_MS_PER_FRAME = 700
GIF_CAPTION_PX = 18
RECORD_KEYS = ("seed", "group_id", "won", "episode_return", "turns")
TURN_KEYS = ("response_text", "response_ids", "action", "action_valid", "reward")
TEXT_FRAME_COLUMNS = 72  # text observations are wrapped to this width when drawn onto GIF frames


# ------------------------------------------------------------------------------------------------- reading
def trajectory_steps(run_dir: str | Path) -> dict[int, Path]:
    """The run's trajectory folders by update step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run directory not found: {run_dir}")
    root = run_dir / "trajectories"
    found = {
        int(match[1]): path
        for path in (root.iterdir() if root.is_dir() else ())
        if (match := STEP_DIR.fullmatch(path.name)) and (path / "trajectories.jsonl").is_file()
    }
    if not found:
        raise ConfigError(
            f"{root} holds no step_*/trajectories.jsonl (the trainer writes one per update step)"
        )
    return dict(sorted(found.items()))


def _step_count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def step_window_arguments() -> argparse.ArgumentParser:
    """An argparse parent for scripts over a run's saved steps: `--steps N` (the first N) or `--last N`."""
    parent = argparse.ArgumentParser(add_help=False)
    window = parent.add_mutually_exclusive_group()
    window.add_argument("--steps", type=_step_count, default=None, help="only the first N update steps")
    window.add_argument("--last", type=_step_count, default=None, help="only the last N update steps")
    return parent


def window_records(run_dir: str | Path, args: argparse.Namespace) -> tuple[int, list[dict[str, Any]]]:
    """(number of update steps, their trajectory records) in the window `step_window_arguments` parsed."""
    window = slice(-args.last, None) if args.last else slice(args.steps)
    step_dirs = list(trajectory_steps(run_dir).values())[window]
    return len(step_dirs), [r for d in step_dirs for r in read_trajectories(d / "trajectories.jsonl")]


def read_trajectories(path: str | Path) -> list[dict[str, Any]]:
    """Trajectory records (`Trajectory.to_record` + `response_tokens`), checked enough to render."""
    records = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            _check_record(record)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{path} line {lineno}: not a trajectory record ({err})") from None
        records.append(record)
    return records


def _check_record(record: dict[str, Any]) -> None:
    _require(record, RECORD_KEYS, "the record")
    for index, turn in enumerate(record["turns"], 1):
        _require(turn, TURN_KEYS, f"turn {index}")
        tokens, gates = _response_tokens(turn), turn.get("gates")
        if gates is not None and len(gates) != len(tokens):
            raise ValueError(f"turn {index} has {len(gates)} gates for {len(tokens)} response tokens")
        for fid in turn.get("images", ()):
            if not FRAME_ID.fullmatch(fid):
                raise ValueError(f"turn {index} names a bad frame id {fid!r}")


def _require(mapping: dict[str, Any], keys: tuple[str, ...], where: str) -> None:
    missing = [key for key in keys if key not in mapping]
    if missing:
        raise ValueError(f"{where} lacks {', '.join(missing)}")


def _response_tokens(turn: dict[str, Any]) -> list[str]:
    """Decoded token strings; token ids stand in when the writer had no tokenizer."""
    return turn.get("response_tokens") or [f"#{i}" for i in turn["response_ids"]]


class Frames:
    """The frames of one step folder, each read from disk once."""

    def __init__(self, frames_dir: Path) -> None:
        self.frames_dir = frames_dir
        self._png: dict[str, bytes] = {}

    def png(self, frame_id: str) -> bytes:
        if frame_id not in self._png:
            path = self.frames_dir / f"{frame_id}.png"
            if not path.is_file():
                raise ConfigError(f"frame file not found: {path}")
            self._png[frame_id] = path.read_bytes()
        return self._png[frame_id]

    def data_uri(self, frame_id: str) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png(frame_id)).decode("ascii")

    def image(self, frame_id: str) -> Image.Image:
        return Image.open(io.BytesIO(self.png(frame_id))).convert("RGB")


# ------------------------------------------------------------------------------------------------- summary
def summary_rows(records: list[dict[str, Any]]) -> dict[str, str]:
    """Summary table rows (label -> formatted value) over `records`."""
    turns = [turn for record in records for turn in record["turns"]]
    gates = [g for turn in turns for g in turn.get("gates") or ()]
    statuses = Counter(record.get("analyzer_status", "pending") for record in records)
    n = max(len(records), 1)
    return {
        "success rate": f"{sum(bool(r['won']) for r in records) / n:.3f}",
        "mean return": f"{sum(r['episode_return'] for r in records) / n:.3f}",
        "mean length": f"{len(turns) / n:.2f}",
        "invalid-action rate": f"{sum(not t['action_valid'] for t in turns) / max(len(turns), 1):.3f}",
        "analyzer": " · ".join(
            f"{s} {statuses[s]}" for s in ANALYZER_STATUSES if statuses[s] or s != "pending"
        ),
        "mean gate": f"{sum(gates) / len(gates):.3f} over {len(gates)} tokens" if gates else "no gates",
    }


# ------------------------------------------------------------------------------------------------- HTML
CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; color: #1b1b1b; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin: 0 0 6px; }
table.summary { border-collapse: collapse; margin-bottom: 8px; }
table.summary th, table.summary td { border: 1px solid #ccc; padding: 3px 10px; text-align: left; }
.legend span { padding: 0 6px; border: 1px solid #ccc; }
section.episode { border: 1px solid #ccc; border-radius: 6px; padding: 12px; margin: 18px 0; }
.won { color: #1e7b34; font-weight: 600; } .lost { color: #b3261e; font-weight: 600; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 6px 0 10px; }
dl.meta dt { color: #666; } dl.meta dd { margin: 0; }
ol.turns { list-style: none; padding: 0; margin: 0; }
li.turn { display: flex; gap: 14px; border-top: 1px solid #eee; padding: 8px 0; }
li.turn.invalid { background: #fff4f2; }
.obs img { image-rendering: pixelated; min-width: 160px; border: 1px solid #999; }
.obs pre { margin: 0; max-width: 420px; white-space: pre-wrap; font-size: 12px; }
.response { flex: 1; min-width: 0; } .response p { margin: 2px 0; }
.mark { color: #fff; background: #b3261e; border-radius: 3px; padding: 0 5px; font-size: 12px; }
.tokens { font: 12px/1.9 ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
.tok { border-radius: 2px; } .nogate { background: #e3e3e3; }
"""


def render_report(
    records: list[dict[str, Any]],
    frames: Frames,
    *,
    title: str,
    summary: dict[str, str],
    gif_links: list[str | None] | None = None,
) -> str:
    """The whole HTML document: the `summary` table, then every episode of `records`; `gif_links` holds
    one relative path (or None) per episode."""
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in summary.items())
    parts = [
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>",
        f"<style>{CSS}</style></head><body><h1>{_e(title)}</h1><table class='summary'>{rows}</table>",
        "<p class='legend'>Response tokens: <span style='background:#ffffff'>gate 0</span> → "
        f"<span style='background:{_gate_color(1.0)}'>gate 1</span> "
        "<span class='nogate'>no gate</span> (no skill, or a preset without OPD); hover for the value.</p>",
    ]
    gif_links = gif_links or [None] * len(records)
    for number, (record, gif_link) in enumerate(zip(records, gif_links, strict=True), 1):
        parts.append(_episode(number, record, frames, gif_link))
    parts.append("</body></html>\n")
    return "".join(parts)


def _episode(number: int, record: dict[str, Any], frames: Frames, gif_link: str | None) -> str:
    outcome = "<span class='won'>won</span>" if record["won"] else "<span class='lost'>lost</span>"
    header = (
        f"Episode {number} · seed {_e(record['seed'])} · group {_e(record['group_id'])} · {outcome} · "
        f"return {record['episode_return']:.2f} · {len(record['turns'])} turns"
    )
    if gif_link:
        header += f" · <a href='{_e(gif_link)}'>GIF</a>"
    meta = {
        "task": record.get("task"),
        "analyzer": record.get("analyzer_status", "pending"),
        "skill": record.get("skill") or "—",
        "summary": record.get("summary") or "—",
    }
    rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in meta.items())
    turns = "".join(_turn(i + 1, turn, frames) for i, turn in enumerate(record["turns"]))
    return (
        f"<section class='episode' id='episode-{number}'><h2>{header}</h2>"
        f"<dl class='meta'>{rows}</dl><ol class='turns'>{turns}</ol></section>"
    )


def _turn(number: int, turn: dict[str, Any], frames: Frames) -> str:
    if turn.get("images"):
        observation = "".join(
            f"<img src='{frames.data_uri(fid)}' alt='frame {_e(fid)}' data-frame='{_e(fid)}'>"
            for fid in turn["images"]
        )
    else:
        observation = f"<pre>{_e(turn.get('observation_text', ''))}</pre>"
    think = THINK.search(turn["response_text"])
    action = f"<code>{_e(turn['action'])}</code>" if turn["action"] is not None else "<em>did not parse</em>"
    mark = "" if turn["action_valid"] else " <span class='mark'>invalid</span>"
    lines = [
        f"<p><b>Turn {number}</b> · reward {turn['reward']:+.2f}</p>",
        f"<p class='think'><b>think:</b> {_e(think[1].strip())}</p>" if think else "",
        f"<p class='action'><b>action:</b> {action}{mark}</p>",
        f"<p class='tokens'>{_tokens(turn)}</p>",
    ]
    css_class = "turn" if turn["action_valid"] else "turn invalid"
    return f"<li class='{css_class}'><div class='obs'>{observation}</div><div class='response'>{''.join(lines)}</div></li>"


def _tokens(turn: dict[str, Any]) -> str:
    tokens, gates = _response_tokens(turn), turn.get("gates")
    if gates is None:
        return "".join(f"<span class='tok nogate' title='no gate'>{_e(t)}</span>" for t in tokens)
    return "".join(
        f"<span class='tok' style='background:{_gate_color(g)}' title='g={g:.3f}'>{_e(t)}</span>"
        for t, g in zip(tokens, gates, strict=True)
    )


def _gate_color(gate: float) -> str:
    g = min(max(gate, 0.0), 1.0)
    return "#" + "".join(f"{round(255 + g * (c - 255)):02x}" for c in GATE_RGB)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


# ------------------------------------------------------------------------------------------------- GIFs
def episode_frames(record: dict[str, Any], frames: Frames) -> list[Image.Image]:
    """One image per observation frame in turn order, captioned with the action taken; a text
    observation is drawn onto an image."""
    out = []
    for number, turn in enumerate(record["turns"], 1):
        action = turn["action"] if turn["action"] is not None else "did not parse"
        caption = f"turn {number}: {action}" + ("" if turn["action_valid"] else " (invalid)")
        images = [frames.image(fid) for fid in turn.get("images", ())] or [
            _text_image(turn["observation_text"])
        ]
        out.extend(_captioned(image, caption) for image in images)
    return out


def write_gif(images: list[Image.Image], path: Path) -> Path:
    """An animated GIF (looping) of `images`, padded onto one canvas size."""
    width, height = max(i.width for i in images), max(i.height for i in images)
    canvases = []
    for image in images:
        canvas = Image.new("RGB", (width, height), "white")
        canvas.paste(image, ((width - image.width) // 2, 0))
        canvases.append(canvas)
    buf = io.BytesIO()
    canvases[0].save(
        buf, format="GIF", save_all=True, append_images=canvases[1:], duration=GIF_MS_PER_FRAME, loop=0
    )
    atomic_write_bytes(path, buf.getvalue())
    return path


def _font(size: int = 12) -> ImageFont.FreeTypeFont:
    import matplotlib  # ships DejaVu Sans Mono: a monospace font on every install, so text grids line up

    return ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts/ttf/DejaVuSansMono.ttf"), size)


def _text_image(text: str) -> Image.Image:
    lines = [
        wrapped for line in text.splitlines() for wrapped in textwrap.wrap(line, TEXT_FRAME_COLUMNS) or [""]
    ]
    font, body = _font(), "\n".join(lines) or " "
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).multiline_textbbox(
        (0, 0), body, font=font
    )
    image = Image.new("RGB", (right - left + 16, bottom - top + 16), "white")
    ImageDraw.Draw(image).multiline_text((8 - left, 8 - top), body, fill="black", font=font)
    return image


def _captioned(image: Image.Image, caption: str) -> Image.Image:
    font = _font(11)
    width = max(image.width, int(font.getlength(caption)) + 8)
    out = Image.new("RGB", (width, image.height + GIF_CAPTION_PX), "white")
    out.paste(image, ((width - image.width) // 2, 0))
    ImageDraw.Draw(out).text((4, image.height + 3), caption, fill="black", font=font)
    return out


# ------------------------------------------------------------------------------------------------- entry
def write_report(
    run_dir: str | Path,
    *,
    step: int | None = None,
    out: str | Path | None = None,
    max_episodes: int = 16,
    gif: bool = False,
) -> Path:
    """Write the report of `step` (default: the latest step with trajectories) to `out` (default
    `RUN_DIR/report_step_N.html`); with `gif`, one animated GIF per shown episode in `<out stem>_gifs/`."""
    if max_episodes < 1:
        raise ConfigError(f"max_episodes must be at least 1, got {max_episodes}")
    run_dir = Path(run_dir)
    steps = trajectory_steps(run_dir)
    if step is None:
        step = max(steps)
    elif step not in steps:
        raise ConfigError(
            f"{run_dir} has no trajectories for step {step} (steps: {', '.join(map(str, steps))})"
        )
    records = read_trajectories(steps[step] / "trajectories.jsonl")
    if not records:
        raise ConfigError(f"{steps[step] / 'trajectories.jsonl'} holds no trajectories")
    out = Path(out) if out is not None else run_dir / f"report_step_{step}.html"
    frames, shown = Frames(steps[step] / "frames"), records[:max_episodes]
    summary = {"episodes shown": f"{len(shown)} of {len(records)}", **summary_rows(records)}

    gif_links: list[str | None] = []
    for number, record in enumerate(shown, 1):
        images = episode_frames(record, frames) if gif else []
        if images:
            name = f"episode_{number:02d}_seed{record['seed']}_group{record['group_id']}.gif"
            write_gif(images, out.with_name(f"{out.stem}_gifs") / name)
            gif_links.append(f"{out.stem}_gifs/{name}")
        else:
            gif_links.append(None)

    title = f"{run_dir.name} · step {step} · {records[0].get('env_name', '?')}"
    atomic_write_text(out, render_report(shown, frames, title=title, summary=summary, gif_links=gif_links))
    return out


# ------------------------------------------------------------------------------------------ gate statistics
ACTION_SPAN = re.compile(r"<action>(.*?)</action>", re.DOTALL)


SAMPLED_P_BINS = (("sampled p >= 0.99", 0.99), ("sampled p 0.9-0.99", 0.9), ("sampled p 0.5-0.9", 0.5),
                  ("sampled p 0.1-0.5", 0.1), ("sampled p < 0.1", 0.0))  # (name, lower bound), highest first


def gate_statistics(run_dir: str | Path, beta: float, steps: range | None = None) -> dict[str, dict[str, float]]:
    """Gates of the saved steps of a run (those in `steps`; all by default), split into the move tokens (inside
    `<action>...</action>`) and the rest, the move tokens also by episode outcome, the token after the move by
    whether it closes the action (`token_after_move`), and every token by the probability the sampler gave it
    (`SAMPLED_P_BINS`; at rollout temperature 1 the student's own): count, mean gate, share open (> 0.5) and
    the mean teacher-student log-prob gap `logit(g) / beta` (nats). Where the skill changes nothing, gates
    sit at 0.5. Sampled tokens have a zero mean likelihood gradient, so gates that favour the unlikely ones
    move probability toward them: entropy rises, and a closing tag gated below its alternatives loses the
    action format."""
    groups: dict[str, list[float]] = {"move": [], "other": [], "move, won": [], "move, lost": []}
    groups |= {"after move, </action>": [], "after move, other": []}
    groups |= {name: [] for name, _ in SAMPLED_P_BINS}
    for step, step_dir in trajectory_steps(run_dir).items():
        if steps is not None and step not in steps:
            continue
        for record in read_trajectories(step_dir / "trajectories.jsonl"):
            outcome = "won" if record["won"] else "lost"
            for turn in record["turns"]:
                if turn.get("gates") is None:
                    continue
                tokens = _response_tokens(turn)
                for is_move, gate in zip(move_token_mask(tokens), turn["gates"], strict=True):
                    groups["move" if is_move else "other"].append(gate)
                    if is_move:
                        groups[f"move, {outcome}"].append(gate)
                if (after := token_after_move(tokens)) is not None:
                    index, closes = after
                    groups["after move, </action>" if closes else "after move, other"].append(turn["gates"][index])
                if turn.get("rollout_logprobs"):  # where the sampler returned its log-probs
                    for logprob, gate in zip(turn["rollout_logprobs"], turn["gates"], strict=True):
                        p = math.exp(logprob)
                        groups[next(name for name, low in SAMPLED_P_BINS if p >= low)].append(gate)
    eps = 1e-6
    return {
        name: {
            "tokens": len(gates),
            "gate_mean": sum(gates) / len(gates),
            "open_frac": sum(g > 0.5 for g in gates) / len(gates),
            "gap_nats": sum(math.log((g + eps) / (1 - g + eps)) for g in gates) / (beta * len(gates)),
        }
        for name, gates in groups.items()
        if gates
    }


def move_gates(turn: dict[str, Any]) -> list[float]:
    """The gates of a turn's move tokens (none where the turn was scored without a skill)."""
    if turn.get("gates") is None:
        return []
    return [gate for is_move, gate in zip(move_token_mask(_response_tokens(turn)), turn["gates"], strict=True)
            if is_move]


def token_after_move(tokens: list[str]) -> tuple[int, bool] | None:
    """The index of the token after the first token of a response's action (the whole move, where the
    tokenizer keeps each move one token, as the toy's does) and whether `</action>` follows that first token
    there; None where the response opens no action, an empty one, or ends at its first token."""
    text = "".join(tokens)
    start = text.find("<action>")
    if start < 0:
        return None
    start += len("<action>")
    if text.startswith("</action>", start):  # an empty action: no move
        return None
    offset = 0
    for index, token in enumerate(tokens[:-1]):
        offset += len(token)
        if offset > start:  # the token that holds the action's first character
            return index + 1, text.startswith("</action>", offset)
    return None


def move_token_mask(tokens: list[str]) -> list[bool]:
    """Which of a response's decoded tokens (they concatenate to the response) overlap the text of its
    action, inside `<action>...</action>`."""
    match = ACTION_SPAN.search("".join(tokens))
    if match is None:
        return [False] * len(tokens)
    mask, offset = [], 0
    for token in tokens:
        mask.append(offset < match.end(1) and offset + len(token) > match.start(1))
        offset += len(token)
    return mask
