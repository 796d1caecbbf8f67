"""Trajectory report: a run directory written by the real trajectory writer (real environment frames, the
tiny model's real tokenizer) rendered to HTML and GIFs, then read back."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageSequence
from transformers import AutoTokenizer

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs.registry import make_env
from seed_vl.envs.sokoban import solve
from seed_vl.processors.messages import HistoryTurn, build_messages
from seed_vl.processors.parsing import parse_action
from seed_vl.report import (
    SAMPLED_P_BINS,
    gate_statistics,
    move_token_mask,
    read_trajectories,
    token_after_move,
    trajectory_steps,
    write_report,
)
from seed_vl.rollout import save_trajectories
from seed_vl.trajectory import Trajectory, Turn

ROOT = Path(__file__).resolve().parents[1]
HOSTILE = "<script>alert('x')</script> & <b>not bold</b>"
FAILING_RESPONSES = [
    HOSTILE,  # does not parse
    "<think>jumping might work</think><action>jump</action>",  # parses, not an admissible action
    "<think>try left</think><action>left</action>",
]


def play(
    env_name: str, seed: int, group_id: int, tokenizer, rng: np.random.Generator, *, win: bool, gated: bool
):
    """One episode of a real environment: the solver's moves (win) or FAILING_RESPONSES."""
    env = make_env(EnvConfig(name=env_name, max_steps=3, cell_px=8))
    obs, info = env.reset(seed)
    responses = (
        [f"<think>the box should go {move}</think><action>{move}</action>" for move in solve(env.state)]
        if win
        else FAILING_RESPONSES
    )
    traj = Trajectory(env_name=env_name, seed=seed, task=info["task"], group_id=group_id)
    history: list[HistoryTurn] = []
    for text in responses:
        context = build_messages(env_name, obs, info, history, history_window=2)
        action, _ = parse_action(text, info["admissible_actions"])
        next_obs, reward, terminated, truncated, info = env.step(action)
        ids = tokenizer(text).input_ids
        traj.turns.append(
            Turn(
                context=context,
                response_text=text,
                response_ids=ids,
                action=action,
                action_valid=info["action_valid"],
                reward=reward,
                observation_text=obs["text"],
                images=list(obs["images"]),
                gates=rng.random(len(ids)).tolist() if gated else None,
                rollout_logprobs=np.log(rng.random(len(ids))).tolist(),
            )
        )
        history.append(HistoryTurn(obs, text, action, info["action_valid"], reward))
        obs = next_obs
        if terminated or truncated:
            break
    traj.won = info["won"]
    traj.episode_return = sum(t.reward for t in traj.turns)
    traj.skill = "Push the box from the side opposite its target." if gated else None
    traj.summary = "Solved it." if win else "Wandered."
    traj.analyzer_status = "ok" if gated else "no_skill"
    return traj


def solvable_seeds(env_name: str, count: int) -> list[int]:
    """Seeds whose room the solver finishes within the episode's 3 moves."""
    env, seeds = make_env(EnvConfig(name=env_name, max_steps=3, cell_px=8)), []
    for seed in range(100):
        env.reset(seed)
        if len(solve(env.state)) <= 3:
            seeds.append(seed)
        if len(seeds) == count:
            return seeds
    raise AssertionError("no short rooms")


def write_run(run_dir: Path, env_name: str, tokenizer, steps=(1, 3)) -> dict[int, list[Trajectory]]:
    rng = np.random.default_rng(0)
    seeds = solvable_seeds(env_name, 2)
    written = {}
    for step in steps:
        trajectories = [
            play(env_name, seeds[0], 0, tokenizer, rng, win=True, gated=True),
            play(env_name, seeds[0], 0, tokenizer, rng, win=False, gated=False),
            play(env_name, seeds[1], 1, tokenizer, rng, win=False, gated=True),
            play(env_name, seeds[1], 1, tokenizer, rng, win=True, gated=True),
        ]
        save_trajectories(trajectories, run_dir / "trajectories" / f"step_{step:06d}", tokenizer=tokenizer)
        written[step] = trajectories
    return written


@pytest.fixture(scope="module")
def tokenizer(tiny_text_path):
    return AutoTokenizer.from_pretrained(tiny_text_path)


@pytest.fixture(scope="module")
def visual_run(tmp_path_factory, tokenizer):
    run_dir = tmp_path_factory.mktemp("visual-run")
    return run_dir, write_run(run_dir, "sokoban_visual", tokenizer)


class Page(HTMLParser):
    """Collects every element (tag, attributes, text) and checks that the non-void tags nest properly."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[dict] = []
        self.open: list[dict] = []
        self.feed(text)
        self.close()
        assert not self.open, f"unclosed tags: {[e['tag'] for e in self.open]}"

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.elements.append(element)
        if tag not in self.VOID:
            self.open.append(element)

    def handle_endtag(self, tag):
        assert self.open and self.open[-1]["tag"] == tag, f"</{tag}> closes <{self.open[-1]['tag']}>"
        self.open.pop()

    def handle_data(self, data):
        for element in self.open:
            element["text"] += data

    def find(self, tag: str, css_class: str | None = None) -> list[dict]:
        return [
            e
            for e in self.elements
            if e["tag"] == tag and (css_class is None or css_class in e["attrs"].get("class", "").split())
        ]


def test_report_shows_every_frame_and_every_gate_in_order(visual_run, tokenizer):
    run_dir, written = visual_run
    page = Page(write_report(run_dir).read_text(encoding="utf-8"))
    trajectories, frames_dir = written[3], run_dir / "trajectories" / "step_000003" / "frames"

    images = page.find("img")
    expected_frames = [image for traj in trajectories for turn in traj.turns for image in turn.images]
    assert len(images) == len(expected_frames)
    for img, expected in zip(images, expected_frames, strict=True):
        src = img["attrs"]["src"]
        assert src.startswith("data:image/png;base64,")  # inlined: the file opens straight from disk
        shown = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1])))
        assert shown.size == expected.size
        assert shown.tobytes() == expected.convert(shown.mode).tobytes()
        assert (frames_dir / f"{img['attrs']['data-frame']}.png").is_file()

    turns = [turn for traj in trajectories for turn in traj.turns]
    tokens = page.find("span", "tok")
    assert [t["text"] for t in tokens] == [tokenizer.decode([i]) for turn in turns for i in turn.response_ids]
    expected_titles = [
        f"g={g:.3f}" if turn.gates is not None else "no gate"
        for turn in turns
        for g in (turn.gates if turn.gates is not None else turn.response_ids)
    ]
    assert [t["attrs"]["title"] for t in tokens] == expected_titles
    assert any(turn.gates is None for turn in turns) and any(turn.gates for turn in turns)


def test_report_marks_invalid_actions_and_escapes_model_text(visual_run):
    run_dir, written = visual_run
    text = write_report(run_dir).read_text(encoding="utf-8")
    page = Page(text)
    turns = [turn for traj in written[3] for turn in traj.turns]
    assert len(page.find("li", "turn")) == len(turns)
    assert len(page.find("li", "invalid")) == sum(not t.action_valid for t in turns) > 0
    assert len(page.find("span", "mark")) == sum(not t.action_valid for t in turns)
    assert not page.find("script")  # model text never becomes markup
    assert all(b["text"] != "not bold" for b in page.find("b"))
    assert any(HOSTILE in t["text"] for t in page.find("p", "tokens"))  # shown verbatim, as text


def test_summary_table_describes_the_whole_step(visual_run, tmp_path):
    run_dir, written = visual_run
    trajectories = written[3]
    page = Page(write_report(run_dir, out=tmp_path / "r.html", max_episodes=3).read_text(encoding="utf-8"))
    summary = {th["text"]: td["text"] for th, td in zip(page.find("th"), page.find("td"), strict=True)}
    turns = [turn for traj in trajectories for turn in traj.turns]
    gates = [g for turn in turns for g in turn.gates or ()]
    assert summary["episodes shown"] == f"3 of {len(trajectories)}"
    assert float(summary["success rate"]) == pytest.approx(np.mean([t.won for t in trajectories]), abs=1e-3)
    assert float(summary["mean return"]) == pytest.approx(
        np.mean([t.episode_return for t in trajectories]), abs=1e-3
    )
    assert float(summary["mean length"]) == pytest.approx(len(turns) / len(trajectories), abs=1e-2)
    invalid = np.mean([not t.action_valid for t in turns])
    assert float(summary["invalid-action rate"]) == pytest.approx(invalid, abs=1e-3)
    statuses = [t.analyzer_status for t in trajectories]
    assert (
        summary["analyzer"] == f"ok {statuses.count('ok')} · no_skill {statuses.count('no_skill')} · error 0"
    )
    assert summary["mean gate"] == f"{np.mean(gates):.3f} over {len(gates)} tokens"
    assert len(page.find("section", "episode")) == 3


def test_step_defaults_to_the_latest_and_can_be_chosen(visual_run, tmp_path):
    run_dir, _ = visual_run
    latest = write_report(run_dir)
    assert latest == run_dir / "report_step_3.html"
    assert "· step 3 ·" in Page(latest.read_text()).find("h1")[0]["text"]
    chosen = write_report(run_dir, step=1, out=tmp_path / "first.html")
    assert "· step 1 ·" in Page(chosen.read_text()).find("h1")[0]["text"]


def test_gif_per_shown_episode_holds_every_frame(visual_run, tmp_path):
    run_dir, written = visual_run
    out = write_report(run_dir, out=tmp_path / "report.html", max_episodes=2, gif=True)
    gifs = sorted((tmp_path / "report_gifs").glob("*.gif"))
    assert len(gifs) == 2
    links = [a["attrs"]["href"] for a in Page(out.read_text()).find("a")]
    assert links == [f"report_gifs/{gif.name}" for gif in gifs]
    for gif, traj in zip(gifs, written[3][:2], strict=True):
        frames = [turn_image for turn in traj.turns for turn_image in turn.images]
        animation = Image.open(gif)
        assert animation.n_frames == len(frames)
        assert animation.width >= frames[0].width and animation.height > frames[0].height  # caption strip
        assert len({f.convert("RGB").tobytes() for f in ImageSequence.Iterator(animation)}) > 1


def test_text_environment_report_shows_observation_text(tmp_path, tokenizer):
    written = write_run(tmp_path / "run", "sokoban_text", tokenizer, steps=(2,))
    out = write_report(tmp_path / "run", gif=True)
    page = Page(out.read_text(encoding="utf-8"))
    turns = [turn for traj in written[2] for turn in traj.turns]
    assert not page.find("img")
    assert [pre["text"] for pre in page.find("pre")] == [turn.observation_text for turn in turns]
    gifs = sorted((tmp_path / "run" / "report_step_2_gifs").glob("*.gif"))
    assert [Image.open(g).n_frames for g in gifs] == [traj.length for traj in written[2]]


def test_bad_run_directories_give_one_line_errors(visual_run, tmp_path):
    run_dir, _ = visual_run
    with pytest.raises(ConfigError, match="run directory not found"):
        write_report(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"no trajectories for step 7 \(steps: 1, 3\)"):
        write_report(run_dir, step=7)

    broken = tmp_path / "broken" / "trajectories" / "step_000001"
    (broken / "frames").mkdir(parents=True)
    record_line = (
        (run_dir / "trajectories" / "step_000001" / "trajectories.jsonl").read_text().splitlines()[0]
    )
    (broken / "trajectories.jsonl").write_text(record_line + "\n")
    with pytest.raises(ConfigError, match="frame file not found: .*frames/"):
        write_report(tmp_path / "broken")
    (broken / "trajectories.jsonl").write_text(record_line + "\n{not json\n")
    with pytest.raises(ConfigError, match="trajectories.jsonl line 2"):
        write_report(tmp_path / "broken")
    record = json.loads(record_line)
    record["turns"][0]["gates"] = record["turns"][0]["gates"][:-1]
    (broken / "trajectories.jsonl").write_text(json.dumps(record) + "\n")
    with pytest.raises(ConfigError, match="line 1: .*turn 1 has \\d+ gates for \\d+ response tokens"):
        write_report(tmp_path / "broken")

    cli = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "visualize_trajectories.py"), str(run_dir), "--step", "7"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2
    assert cli.stderr.strip().count("\n") == 0 and "step 7" in cli.stderr


def test_gate_statistics_split_move_tokens_from_the_rest(visual_run):
    run_dir, written = visual_run
    beta = 5.0
    stats = gate_statistics(run_dir, beta=beta)

    move, other, unlikely = [], [], []
    for step_dir in trajectory_steps(run_dir).values():
        for record in read_trajectories(step_dir / "trajectories.jsonl"):
            for turn in record["turns"]:
                if turn["gates"] is None:
                    continue
                sampled = zip(turn["gates"], turn["rollout_logprobs"], strict=True)
                unlikely += [gate for gate, logprob in sampled if logprob < np.log(0.1)]
                mask = move_token_mask(turn["response_tokens"])
                moved = "".join(t for t, m in zip(turn["response_tokens"], mask, strict=True) if m)
                if turn["action"] is not None:  # a parsed action: the move tokens spell it, and little more
                    assert turn["action"] in moved.lower() and len(moved) < len(turn["action"]) + 4
                move += [g for g, m in zip(turn["gates"], mask, strict=True) if m]
                other += [g for g, m in zip(turn["gates"], mask, strict=True) if not m]
    gated = [g for trajectories in written.values() for t in trajectories for turn in t.turns for g in turn.gates or ()]
    assert sorted(move + other) == sorted(gated)
    assert stats["move"]["tokens"] == len(move) and stats["other"]["tokens"] == len(other)
    assert stats["move, won"]["tokens"] + stats["move, lost"]["tokens"] == len(move)
    assert stats["move"]["gate_mean"] == pytest.approx(np.mean(move))
    assert stats["other"]["open_frac"] == pytest.approx(np.mean(np.array(other) > 0.5))
    # every gated token once more, by the probability the sampler gave it
    assert sum(stats[name]["tokens"] for name, _ in SAMPLED_P_BINS) == len(gated)
    assert stats["sampled p < 0.1"]["gate_mean"] == pytest.approx(np.mean(unlikely))
    assert stats["move"]["gap_nats"] == pytest.approx(np.mean(np.log(np.array(move) / (1 - np.array(move)))) / beta, rel=1e-3)
    # the token after each move, once per turn with an action
    after = [turn for trajectories in written.values() for t in trajectories for turn in t.turns
             if turn.gates and "<action>" in turn.response_text and "<action></action>" not in turn.response_text]
    assert sum(stats.get(f"after move, {name}", {"tokens": 0})["tokens"] for name in ("</action>", "other")) == len(after) > 0
    # a window of updates holds the gates of its steps alone
    last = max(written)
    window = gate_statistics(run_dir, beta=beta, steps=range(last, last + 1))
    gated_last = [g for t in written[last] for turn in t.turns for g in turn.gates or ()]
    assert window["move"]["tokens"] + window["other"]["tokens"] == len(gated_last) < len(gated)


def test_gate_stats_script_prints_one_block_per_window_of_updates(visual_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(visual_run[0], run_dir)
    (run_dir / "config.yaml").write_text("algorithm:\n  preset: seed\n")
    script = [sys.executable, str(ROOT / "scripts" / "gate_stats.py"), str(run_dir)]
    rows = subprocess.run([*script, "--window", "2"], capture_output=True, text=True, timeout=60, check=True).stdout
    windows = {line.split(" | ")[1] for line in rows.splitlines()[2:]}
    assert windows == {"1-2", "3-4"}  # the fixture saved updates 1 and 3
    whole = subprocess.run(script, capture_output=True, text=True, timeout=60, check=True).stdout
    assert {line.split(" | ")[1] for line in whole.splitlines()[2:]} == {"1-3"}
    bad = subprocess.run([*script, "--window", "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--window" in bad.stderr.strip().splitlines()[-1]


def test_the_token_after_the_move_and_whether_it_closes_the_action():
    tokens = ["<think>", "go", "</think>", "<action>", "up", "</action>"]
    assert token_after_move(tokens) == (5, True)
    assert token_after_move(["<think>", "x", "</think>", "<action>", "up", "1", "0", "</action>"]) == (5, False)
    assert token_after_move(["<action>", "le", "ft", "</action>"]) == (2, False)  # a move split in two tokens
    assert token_after_move(["<think>x</think><action>up", "</action>"]) == (1, True)  # a straddling token
    assert token_after_move(["<think>", "x", "</think>"]) is None  # no action
    assert token_after_move(["<action>", "</action>"]) is None  # an empty one
    assert token_after_move(["<action>", "up"]) is None  # nothing after the move


def test_move_tokens_are_the_ones_inside_the_action_tags():
    tokens = ["<think>", "go", " up", "</think>", "<action>", "le", "ft", "</action>"]
    assert move_token_mask(tokens) == [False] * 5 + [True, True, False]
    assert move_token_mask(["<think>", "x", "</think>"]) == [False] * 3  # no action: no move token
    assert move_token_mask(["<think>x</think><action>up", "</action>"]) == [True, False]  # a straddling token
