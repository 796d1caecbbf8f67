"""Analyzer: prompt, parsing, and the three backends (DESIGN §1 stage 2 step 2)."""

from __future__ import annotations

import base64
import copy
import io
import json
import logging
import re
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from seed_vl.analyzer import (
    IMAGE_PLACEHOLDER,
    build_analyzer_prompt,
    format_analysis,
    make_analyzer,
    parse_analysis,
)
from seed_vl.config import AnalyzerConfig, ConfigError, EnvConfig
from seed_vl.envs.group import EnvGroup
from seed_vl.policy import Generation, Policy
from seed_vl.processors.prompts import TASK_PREFIX
from seed_vl.rollout import SamplingSettings, collect_rollouts
from seed_vl.skills import insert_skill, skill_block
from seed_vl.trajectory import Trajectory, Turn

SKILL = "Push the box from the side opposite its target."
GOOD = format_analysis("The agent pushed the box onto the target.", SKILL)
SECRET = "sk-test-do-not-leak-1234567890"


# ------------------------------------------------------------------------------------------ parsing
@pytest.mark.parametrize(
    "text",
    [
        GOOD,
        f"```json\n{GOOD}\n```",
        f"Here is my analysis:\n{GOOD}\nThanks.",
        f'{{"note": "a first, unrelated object"}} then {GOOD}',
        '{"episode_summary": "s", "episode_skill": "Push   the box from\\nthe side opposite its target."}',
    ],
)
def test_parse_accepts_json_anywhere_in_the_text(text):
    summary, skill = parse_analysis(text, min_words=5)
    assert skill == SKILL
    assert summary


@pytest.mark.parametrize(
    "text",
    [
        "",
        "no json here",
        '{"episode_summary": "s"}',  # skill missing
        '{"episode_summary": "s", "episode_skill": "too short"}',
        '{"episode_summary": "s", "episode_skill": ["push", "the", "box", "to", "target"]}',
        '{"episode_summary": "  ", "episode_skill": "Push the box from the side."}',
        '{"episode_summary": "s", "episode_skill": "Push the box from the side."',  # unterminated
    ],
)
def test_parse_rejects(text):
    assert parse_analysis(text, min_words=5) is None


# ------------------------------------------------------------------------------------------ helpers
def _frame(color: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (8, 8), color)


def _trajectory(task: str, *, won: bool = True, steps: int = 2, images: bool = False) -> Trajectory:
    """A hand-made trajectory: each turn's context ends with its observation (and its frame)."""
    traj = Trajectory(env_name="sokoban_visual", seed=0, task=task, group_id=0, won=won, episode_return=1.0)
    for k in range(steps):
        frame = _frame((10 * k, 0, 0))
        content = [{"type": "text", "text": f"Task: {task}\nobservation {k}"}]
        if images:
            content.append({"type": "image", "image": frame})
        traj.turns.append(
            Turn(
                context=[{"role": "user", "content": content}],
                response_text=f"<think>t{k}</think><action>up</action>",
                response_ids=[1, 2],
                action="up" if k else None,
                action_valid=bool(k),
                reward=0.0,
                observation_text=f"observation {k}",
                images=[frame] if images else [],
            )
        )
    return traj


class ChatServer:
    """A local OpenAI-compatible endpoint; per task a script of answers, the last one repeating.

    An answer is a str (the message content), an int (an HTTP status), b"..." (a raw 200 body) or
    ("sleep", seconds, answer)."""

    def __init__(self) -> None:
        self.scripts: dict[str, list] = {}
        self.requests: list[dict] = []
        self.calls: dict[str, int] = defaultdict(int)
        self.in_flight = self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                content = body["messages"][0]["content"]
                text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
                task = re.search(r"Task: (.*)", text).group(1)
                with server.lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    script = server.scripts[task]
                    answer = script[min(server.calls[task], len(script) - 1)]
                    server.calls[task] += 1
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    self._answer(answer)
                except OSError:  # the client gave up (timeout test)
                    pass
                finally:
                    with server.lock:
                        server.in_flight -= 1

            def _answer(self, answer):
                if isinstance(answer, tuple):
                    time.sleep(answer[1])
                    answer = answer[2]
                if isinstance(answer, int):
                    self.send_error(answer)
                    return
                raw = answer
                if isinstance(answer, str):
                    raw = json.dumps(
                        {"choices": [{"message": {"role": "assistant", "content": answer}}]}
                    ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    server = ChatServer()
    yield server
    server.close()


def _external(server: ChatServer, monkeypatch, **overrides) -> object:
    monkeypatch.setenv("SEED_VL_TEST_KEY", SECRET)
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):  # talk to 127.0.0.1 directly
        monkeypatch.delenv(proxy, raising=False)
    settings = dict(
        backend="external", base_url=server.url, model="judge", api_key_env="SEED_VL_TEST_KEY",
        timeout_s=2.0, max_retries=2, retry_backoff_s=0.01, max_concurrency=4,
    )  # fmt: skip
    return make_analyzer(AnalyzerConfig(**{**settings, **overrides}), EnvConfig(), seed=7)


# ------------------------------------------------------------------------------------------ external
def test_external_good_answer_sets_the_skill_and_sends_images_as_data_urls(chat_server, monkeypatch):
    chat_server.scripts["solve"] = [f"```json\n{GOOD}\n```"]
    traj = _trajectory("solve", images=True)
    analyzer = _external(chat_server, monkeypatch)

    [result] = analyzer.analyze([traj], step=3)

    assert (result.status, result.skill, result.attempts) == ("ok", SKILL, 1)
    assert (traj.analyzer_status, traj.skill, traj.summary) == ("ok", SKILL, result.summary)
    [request] = chat_server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert request["body"]["model"] == "judge"
    urls = [
        p["image_url"]["url"] for p in request["body"]["messages"][0]["content"] if p["type"] == "image_url"
    ]
    assert len(urls) == 2 and all(u.startswith("data:image/png;base64,") for u in urls)
    sent = Image.open(io.BytesIO(base64.b64decode(urls[1].split(",", 1)[1])))
    assert sent.convert("RGB").tobytes() == traj.turns[1].context[0]["content"][1]["image"].tobytes()
    assert analyzer.counts["ok"] == 1 and analyzer.counts["trajectories"] == 1


def test_external_garbage_gets_two_attempts_then_no_skill(chat_server, monkeypatch):
    chat_server.scripts["garbage"] = ["I think the agent did fine.", '{"episode_skill": "short"}']
    chat_server.scripts["second"] = ["not json", GOOD]
    trajs = [_trajectory("garbage"), _trajectory("second")]
    results = _external(chat_server, monkeypatch).analyze(trajs)

    assert [r.status for r in results] == ["no_skill", "ok"]
    assert [r.attempts for r in results] == [2, 2]
    assert trajs[0].skill is None and trajs[0].analyzer_status == "no_skill"
    assert chat_server.calls == {"garbage": 2, "second": 2}
    seeds = [r["body"]["seed"] for r in chat_server.requests if "garbage" in json.dumps(r["body"])]
    assert len(set(seeds)) == 2  # the second attempt samples with another seed


def test_external_retries_server_errors_then_succeeds(chat_server, monkeypatch):
    chat_server.scripts["flaky"] = [500, 503, GOOD]
    analyzer = _external(chat_server, monkeypatch)
    [result] = analyzer.analyze([_trajectory("flaky")])
    assert result.status == "ok"
    assert chat_server.calls["flaky"] == 3
    assert analyzer.counts["retries"] == 2


@pytest.mark.parametrize(
    "script, tries, message",
    [
        ([500], 3, "HTTP 500"),  # max_retries = 2: three tries
        ([b"<html>bad gateway</html>"], 3, "malformed"),
        ([401], 1, "HTTP 401"),  # a bad key will not get better: no retry
        ([("sleep", 0.5, GOOD)], 3, "timed out|Timeout"),
    ],
)
def test_external_failures_are_counted_errors_and_never_leak_the_key(
    chat_server, monkeypatch, caplog, script, tries, message
):
    chat_server.scripts["broken"] = script
    traj = _trajectory("broken")
    analyzer = _external(chat_server, monkeypatch, timeout_s=0.05)
    with caplog.at_level(logging.DEBUG):
        [result] = analyzer.analyze([traj])
    assert result.status == "error" and traj.skill is None and traj.analyzer_status == "error"
    assert re.search(message, result.error)
    assert chat_server.calls["broken"] == tries
    assert analyzer.counts["error"] == 1
    assert SECRET not in result.error and SECRET not in caplog.text


def test_external_concurrency_is_bounded(chat_server, monkeypatch):
    tasks = [f"task{i}" for i in range(6)]
    for task in tasks:
        chat_server.scripts[task] = [("sleep", 0.1, GOOD)]
    results = _external(chat_server, monkeypatch, max_concurrency=2).analyze([_trajectory(t) for t in tasks])
    assert all(r.status == "ok" for r in results)
    assert chat_server.max_in_flight == 2


def test_external_configuration_errors_name_the_field(monkeypatch):
    monkeypatch.delenv("SEED_VL_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError, match="analyzer.base_url"):
        make_analyzer(AnalyzerConfig(backend="external", model="m"), EnvConfig())
    with pytest.raises(ConfigError, match="analyzer.model"):
        make_analyzer(AnalyzerConfig(backend="external", base_url="http://127.0.0.1:9/v1"), EnvConfig())
    config = AnalyzerConfig(
        backend="external", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="SEED_VL_MISSING_KEY"
    )
    with pytest.raises(ConfigError, match="SEED_VL_MISSING_KEY"):
        make_analyzer(config, EnvConfig())


def test_unreachable_endpoint_is_an_error_not_a_crash(monkeypatch):
    config = AnalyzerConfig(
        backend="external", base_url="http://127.0.0.1:9/v1", model="m", api_key_env="",
        timeout_s=0.2, max_retries=1, retry_backoff_s=0.0,
    )  # fmt: skip
    [result] = make_analyzer(config, EnvConfig()).analyze([_trajectory("nobody home")])
    assert result.status == "error"


# ------------------------------------------------------------------------------------------ prompt
def test_prompt_shows_task_outcome_and_last_steps():
    traj = _trajectory("push the box", won=False, steps=5, images=True)
    [message] = build_analyzer_prompt(traj, with_images=False, max_steps=3)
    text = message["content"]  # no image items: plain text
    assert "Task: push the box" in text and "Outcome: failure" in text
    assert "avoidance rule" in text and "workflow" not in text
    assert "Step 3:\n" in text and "Step 5:\n" in text and "Step 1:\n" not in text
    # Every step's action on one line, in a route's wording (step 1's answer did not parse)
    assert "Actions taken: step 1 no action (the answer did not parse), step 2 up, step 3 up," in text
    assert text.index("Step 5:\n") < text.index("Actions taken:") < text.index("avoidance rule")
    assert text.count(IMAGE_PLACEHOLDER) == 3
    assert text.count("Action valid: yes") == 3  # steps 3-5 were valid, step 1 (not shown) was not
    assert '"episode_summary"' in text and '"episode_skill"' in text

    success = build_analyzer_prompt(_trajectory("push the box", won=True), with_images=True, max_steps=8)
    text = success[0]["content"]
    assert "Outcome: success" in text and "workflow skill" in text and "Action valid: no" in text


def test_prompt_with_images_interleaves_each_steps_frame():
    traj = _trajectory("push the box", steps=3, images=True)
    content = build_analyzer_prompt(traj, with_images=True, max_steps=8)[0]["content"]
    images = [i["image"] for i in content if i["type"] == "image"]
    assert images == [t.context[0]["content"][1]["image"] for t in traj.turns]
    assert IMAGE_PLACEHOLDER not in "".join(i["text"] for i in content if i["type"] == "text")


# ------------------------------------------------------------------------------------------ self (retry logic)
class ScriptedGenerate:
    """Stands in for `Policy.generate` to drive the retry logic only: answers are consumed per call."""

    is_vision = False

    def __init__(self, answers_per_call: list[list[str]] | Exception) -> None:
        self.answers_per_call = answers_per_call
        self.calls: list[dict] = []

    def generate(self, contexts, *, max_new_tokens, temperature, top_p, stop_strings, seeds):
        self.calls.append({"contexts": contexts, "seeds": list(seeds)})
        if isinstance(self.answers_per_call, Exception):
            raise self.answers_per_call
        return [Generation(text=t, token_ids=[]) for t in self.answers_per_call[len(self.calls) - 1]]


def test_self_analyzer_retries_only_unparsed_trajectories_with_new_seeds():
    fake = ScriptedGenerate([[GOOD, "garbage", "garbage"], ["still garbage", GOOD]])
    trajs = [_trajectory(f"t{i}") for i in range(3)]
    analyzer = make_analyzer(AnalyzerConfig(backend="self"), EnvConfig(), policy=fake, seed=5)

    results = analyzer.analyze(trajs, step=2)

    assert [r.status for r in results] == ["ok", "no_skill", "ok"]
    assert [r.attempts for r in results] == [1, 2, 2]
    assert [t.analyzer_status for t in trajs] == ["ok", "no_skill", "ok"]
    first, second = fake.calls
    assert len(first["contexts"]) == 3 and len(second["contexts"]) == 2
    assert "Task: t1" in second["contexts"][0][0]["content"]
    assert len(set(first["seeds"])) == 3 and not set(first["seeds"]) & set(second["seeds"])
    assert dict(analyzer.counts) == {"ok": 2, "no_skill": 1, "attempts": 5, "trajectories": 3}

    again = ScriptedGenerate([[GOOD, "garbage", "garbage"], ["still garbage", GOOD]])
    make_analyzer(AnalyzerConfig(backend="self"), EnvConfig(), policy=again, seed=5).analyze(trajs, step=2)
    assert again.calls[0]["seeds"] == first["seeds"]  # seeds derive from (seed, step, index, attempt)


def test_self_analyzer_failure_marks_errors_and_does_not_raise():
    fake = ScriptedGenerate(RuntimeError("CUDA out of memory"))
    trajs = [_trajectory("a"), _trajectory("b")]
    results = make_analyzer(AnalyzerConfig(backend="self"), EnvConfig(), policy=fake).analyze(trajs)
    assert [r.status for r in results] == ["error", "error"]
    assert "out of memory" in results[0].error
    assert all(t.skill is None for t in trajs)


# ------------------------------------------------------------------------------------------ self (tiny models)
def test_self_analyzer_with_the_tiny_text_model_is_deterministic(tiny_text_path):
    policy = Policy.from_pretrained(tiny_text_path, device="cpu")
    config = AnalyzerConfig(backend="self", max_new_tokens=16)

    def run(seed: int) -> list:
        trajs = [_trajectory("push the box", won=bool(i), steps=3) for i in range(2)]
        analyzer = make_analyzer(config, EnvConfig(name="sokoban_text"), policy=policy, seed=seed)
        return analyzer.analyze(trajs, step=1), trajs, analyzer

    results, trajs, analyzer = run(seed=0)
    # An untrained tiny model writes no valid JSON: every trajectory ends as "no skill" after 2 attempts.
    assert [(r.status, r.attempts) for r in results] == [("no_skill", 2)] * 2
    assert all(t.skill is None and t.analyzer_status == "no_skill" for t in trajs)
    assert analyzer.counts["attempts"] == 4 and all(r.raw for r in results)
    assert [r.raw for r in run(seed=0)[0]] == [r.raw for r in results]
    assert [r.raw for r in run(seed=1)[0]] != [r.raw for r in results]


def test_self_analyzer_shows_a_vision_policy_the_frames(tiny_vl_path):
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu")
    assert policy.is_vision
    trajs = [_trajectory("push the box", steps=2, images=True) for _ in range(2)]
    analyzer = make_analyzer(AnalyzerConfig(backend="self", max_new_tokens=16), EnvConfig(), policy=policy)
    policy.cache.clear()
    results = analyzer.analyze(trajs)
    assert [r.status for r in results] == ["no_skill", "no_skill"]
    assert policy.cache.stats()["images_seen"] == 2 * 2 * 2  # 2 trajectories x 2 frames x 2 attempts


# ------------------------------------------------------------------------------------------ scripted (real rollouts)
@pytest.fixture(scope="module")
def visual_rollouts(tiny_vl_path):
    """Real episodes: the tiny VL policy plays visual Sokoban (3 steps) through the real rollout path."""
    policy = Policy.from_pretrained(tiny_vl_path, device="cpu", min_pixels=28 * 28, max_pixels=128 * 28 * 28)
    env_config = EnvConfig(name="sokoban_visual", max_steps=3)
    group = EnvGroup(env_config, num_tasks=2, group_size=1)
    sampling = SamplingSettings(max_new_tokens=16, temperature=1.0)
    trajectories = collect_rollouts(
        policy, group, sampling, seed=0, step=0
    )
    return env_config, trajectories


def test_scripted_analyzer_on_real_rollouts(visual_rollouts):
    env_config, trajectories = visual_rollouts
    config = AnalyzerConfig(backend="scripted")

    results = make_analyzer(config, env_config, seed=3).analyze(trajectories, step=0)

    assert [r.status for r in results] == ["ok"] * len(trajectories)
    assert all(len(t.skill.split()) >= config.min_skill_words and t.summary for t in trajectories)
    again = make_analyzer(config, env_config, seed=3).analyze(copy.deepcopy(trajectories), step=0)
    assert [r.skill for r in again] == [r.skill for r in results]
    # The teacher context of every turn carries the skill right after the task line.
    for traj in trajectories:
        for turn in traj.turns:
            augmented = insert_skill(turn.context, traj.skill)
            task_line = f"{TASK_PREFIX} {traj.task}\n"
            assert f"{task_line}{skill_block(traj.skill)}\n" in augmented[1]["content"][0]["text"]


def test_prompt_of_a_real_visual_trajectory_carries_each_turns_frame(visual_rollouts):
    _, trajectories = visual_rollouts
    traj = trajectories[0]
    content = build_analyzer_prompt(traj, with_images=True, max_steps=8)[0]["content"]
    frames = [item["image"] for item in content if item["type"] == "image"]
    assert len(frames) == traj.length
    assert all(f is turn.images[0] for f, turn in zip(frames, traj.turns, strict=True))
    text = "".join(item["text"] for item in content if item["type"] == "text")
    for turn in traj.turns:
        assert turn.response_text in text


def test_scripted_analyzer_rejects_a_mismatched_environment(visual_rollouts):
    _, trajectories = visual_rollouts
    analyzer = make_analyzer(AnalyzerConfig(backend="scripted"), EnvConfig(name="ezpoints_text"))
    results = analyzer.analyze(copy.deepcopy(trajectories[:1]))
    assert results[0].status == "error" and "sokoban_visual" in results[0].error
