"""Hindsight analyzer: one short policy-facing skill per finished trajectory (DESIGN §1 stage 1 step 2 and
stage 2 step 2).

Three backends behind one interface, chosen by `analyzer.backend`:
  self      the current frozen policy reads the trajectory and writes the JSON (SEED's self-evolving loop);
  external  any OpenAI-compatible chat-completions endpoint (stage 1's teacher; images as data URLs);
  scripted  the environments' own hindsight rules (offline stand-in for an external model).

Whatever goes wrong (HTTP errors, timeouts, unparseable answers, a crashing backend), the trajectory is
marked "no skill" or "error" and counted; it then gets no OPD term and training goes on.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import logging
import os
import random
import threading
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from seed_vl.config import AnalyzerConfig, ConfigError, EnvConfig
from seed_vl.envs.hindsight import scripted_hindsight
from seed_vl.policy import Policy
from seed_vl.processors.prompts import TASK_PREFIX, one_line
from seed_vl.rollout import derive_seed
from seed_vl.trajectory import Trajectory, Turn

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<image>"
SUMMARY_KEY, SKILL_KEY = "episode_summary", "episode_skill"
_INSTRUCTIONS = {
    True: "The episode succeeded. Write a workflow skill: the decision rule and the order of actions that worked.",
    False: "The episode failed. Write an avoidance rule: the core mistake and the warning signs that it is happening.",
}
# Analyzer seeds hash (stream, seed, step, index, attempt): never equal to a rollout seed of the same run.
_SEED_STREAM = 0xA7A1
# Worth retrying: the server may answer next time. Other 4xx (bad key, bad request) will not change.
_RETRYABLE_HTTP = {408, 409, 429}

Status = Literal["ok", "no_skill", "error"]
Messages = list[dict[str, Any]]


@dataclass(frozen=True)
class AnalysisResult:
    status: Status
    summary: str | None = None
    skill: str | None = None
    attempts: int = 0
    raw: str = ""  # the last answer, kept for reports and debugging
    error: str = ""


# ------------------------------------------------------------------------------------------ prompt / parse
def build_analyzer_prompt(trajectory: Trajectory, *, with_images: bool, max_steps: int) -> Messages:
    """The analyzer's chat messages (DESIGN §1 stage 2 step 2), also stage 1's SFT prompt.

    Success is the environment's `won` flag. Each of the last `max_steps` steps in full: observation text,
    its frame(s) as image items (`with_images`, for vision models) or an `<image>` placeholder, the response
    and whether its action was valid. Then every step's action on one line, in a route's own wording ("step
    1 up, step 2 left, ..."): the prompt stays bounded, and a workflow skill names the whole winning order
    by quoting it.
    """
    shown = trajectory.turns[-max_steps:]
    content: list[dict[str, Any]] = []
    lines = [
        "You are reviewing a finished episode of an agent to write one hindsight skill for it.",
        f"{TASK_PREFIX} {one_line(trajectory.task)}",
        f"Outcome: {'success' if trajectory.won else 'failure'} (return {trajectory.episode_return:.2f})",
        f"Steps: the last {len(shown)} of {trajectory.length} in full.",
    ]
    first_step = trajectory.length - len(shown) + 1
    for number, turn in enumerate(shown, start=first_step):
        lines += [f"Step {number}:", f"Observation: {turn.observation_text}"]
        for image in turn.images:
            if with_images and isinstance(image, Image.Image):
                content.append({"type": "text", "text": "\n".join(lines) + "\n"})
                content.append({"type": "image", "image": image})
                lines = []
            else:
                lines.append(IMAGE_PLACEHOLDER)
        lines += [f"Response: {turn.response_text}", f"Action valid: {'yes' if turn.action_valid else 'no'}"]
    lines += [
        f"Actions taken: {', '.join(_action_step(k, turn) for k, turn in enumerate(trajectory.turns, start=1))}",
        _INSTRUCTIONS[trajectory.won],
        "One short policy-facing skill, not a retrospective explanation.",
        f'Answer with JSON only: {{"{SUMMARY_KEY}": "<one sentence>", "{SKILL_KEY}": "<the skill>"}}',
    ]
    if not content:  # no image items: plain text content, which every chat template accepts
        return [{"role": "user", "content": "\n".join(lines)}]
    content.append({"type": "text", "text": "\n".join(lines)})
    return [{"role": "user", "content": content}]


def _action_step(number: int, turn: Turn) -> str:
    if turn.action is None:
        return f"step {number} no action (the answer did not parse)"
    return f"step {number} {turn.action}" + ("" if turn.action_valid else " (invalid)")


def format_analysis(summary: str, skill: str) -> str:
    """The answer JSON, as stage 1 SFT targets it and `parse_analysis` reads it back."""
    return json.dumps({SUMMARY_KEY: summary, SKILL_KEY: skill}, ensure_ascii=False)


def parse_analysis(text: str, min_words: int) -> tuple[str, str] | None:
    """(summary, skill) from the first JSON object holding both as strings, the skill at least `min_words`
    words long; code fences and text around the object are ignored. None when there is no such object."""
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start != -1:
        try:
            obj, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(obj, dict):
            summary, skill = obj.get(SUMMARY_KEY), obj.get(SKILL_KEY)
            if isinstance(summary, str) and isinstance(skill, str):
                summary, skill = " ".join(summary.split()), " ".join(skill.split())
                if summary and len(skill.split()) >= min_words:
                    return summary, skill
        start = text.find("{", end)
    return None


# ------------------------------------------------------------------------------------------ backends
class Analyzer(ABC):
    """`analyze` fills `skill`, `summary` and `analyzer_status` of each trajectory; `counts` add up over calls."""

    def __init__(self, config: AnalyzerConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()  # counters are bumped from worker threads (external backend)

    def analyze(self, trajectories: Sequence[Trajectory], *, step: int = 0) -> list[AnalysisResult]:
        results = self._analyze(list(trajectories), step) if trajectories else []
        for traj, result in zip(trajectories, results, strict=True):
            traj.skill, traj.summary, traj.analyzer_status = result.skill, result.summary, result.status
            self._count(result.status)
            self._count("attempts", result.attempts)
        self._count("trajectories", len(results))
        errors = [r.error for r in results if r.status == "error"]
        if errors:
            logger.warning(
                "analyzer: %d of %d trajectories failed (first: %s)", len(errors), len(results), errors[0]
            )
        return results

    @abstractmethod
    def _analyze(self, trajectories: list[Trajectory], step: int) -> list[AnalysisResult]: ...

    def _count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self.counts[key] += n

    def _seed(self, step: int, trajectories: list[Trajectory], index: int, attempt: int) -> int:
        """Keyed by the episode's index in the step's whole batch, so that processes splitting a batch
        draw what one process would."""
        episode = trajectories[index].episode_id
        return derive_seed(_SEED_STREAM, self.seed, step, index if episode is None else episode, attempt)

    def _first_valid(self, propose: Callable[[int], str]) -> AnalysisResult:
        """Ask `propose(attempt)` up to `attempts` times; the first answer that parses wins."""
        raw = ""
        for attempt in range(self.config.attempts):
            try:
                raw = propose(attempt)
            except Exception as err:  # any backend failure costs this trajectory its skill, never the run
                return AnalysisResult("error", attempts=attempt + 1, error=f"{type(err).__name__}: {err}")
            parsed = parse_analysis(raw, self.config.min_skill_words)
            if parsed is not None:
                return AnalysisResult("ok", *parsed, attempts=attempt + 1, raw=raw)
        return AnalysisResult("no_skill", attempts=self.config.attempts, raw=raw)


class SelfAnalyzer(Analyzer):
    """The frozen current policy analyzes its own trajectories, all of them in one batched `generate` per
    attempt; attempt k of trajectory i samples with a seed derived from (seed, step, i, k)."""

    def __init__(self, config: AnalyzerConfig, policy: Policy, seed: int) -> None:
        super().__init__(config, seed)
        self.policy = policy

    def _analyze(self, trajectories: list[Trajectory], step: int) -> list[AnalysisResult]:
        cfg = self.config
        prompts = [
            build_analyzer_prompt(t, with_images=self.policy.is_vision, max_steps=cfg.max_steps_shown)
            for t in trajectories
        ]
        results: dict[int, AnalysisResult] = {}
        pending = list(range(len(trajectories)))
        for attempt in range(cfg.attempts):
            try:
                generations = self.policy.generate(
                    [prompts[i] for i in pending],
                    max_new_tokens=cfg.max_new_tokens,
                    temperature=cfg.temperature,
                    top_p=1.0,
                    stop_strings=(),
                    seeds=[self._seed(step, trajectories, i, attempt) for i in pending],
                )
            except Exception as err:  # e.g. out of memory on a long prompt: no skills this step
                error = f"{type(err).__name__}: {err}"
                results.update(
                    {i: AnalysisResult("error", attempts=attempt + 1, error=error) for i in pending}
                )
                break
            still_pending = []
            for i, generation in zip(pending, generations, strict=True):
                parsed = parse_analysis(generation.text, cfg.min_skill_words)
                if parsed is not None:
                    results[i] = AnalysisResult("ok", *parsed, attempts=attempt + 1, raw=generation.text)
                else:
                    results[i] = AnalysisResult("no_skill", attempts=attempt + 1, raw=generation.text)
                    still_pending.append(i)
            pending = still_pending
        return [results[i] for i in range(len(trajectories))]


class ScriptedAnalyzer(Analyzer):
    """The environment's rule-based hindsight (`seed_vl.envs.hindsight`), checked like any other answer."""

    def __init__(self, config: AnalyzerConfig, env_config: EnvConfig, seed: int) -> None:
        super().__init__(config, seed)
        self.env_config = env_config

    def _analyze(self, trajectories: list[Trajectory], step: int) -> list[AnalysisResult]:
        def propose(index: int, attempt: int) -> str:
            rng = random.Random(self._seed(step, trajectories, index, attempt))
            answer = scripted_hindsight(trajectories[index], rng, self.env_config)
            return json.dumps(answer)

        return [self._first_valid(lambda attempt, i=i: propose(i, attempt)) for i in range(len(trajectories))]


class ExternalAnalyzer(Analyzer):
    """An OpenAI-compatible `POST {base_url}/chat/completions`, at most `max_concurrency` requests in flight.

    Each request gets `timeout_s`; timeouts, connection errors, 408/409/429/5xx and malformed bodies are
    retried `max_retries` times with exponential backoff and seeded jitter. The API key is read once from
    the variable named by `api_key_env` and only ever sent in the Authorization header: it is never logged
    nor put in an error.
    """

    def __init__(self, config: AnalyzerConfig, seed: int) -> None:
        super().__init__(config, seed)
        if not config.base_url:
            raise ConfigError(
                "analyzer.base_url: required by the external backend (e.g. http://host:8000/v1)"
            )
        if not config.model:
            raise ConfigError("analyzer.model: required by the external backend")
        self._url = config.base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json"}
        if config.api_key_env:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ConfigError(
                    f"analyzer.api_key_env: environment variable {config.api_key_env} is not set"
                )
            self._headers["Authorization"] = f"Bearer {key}"

    def _analyze(self, trajectories: list[Trajectory], step: int) -> list[AnalysisResult]:
        def analyze_one(index: int) -> AnalysisResult:
            prompt = build_analyzer_prompt(
                trajectories[index], with_images=True, max_steps=self.config.max_steps_shown
            )
            messages = to_openai_messages(prompt)
            return self._first_valid(
                lambda attempt: self._complete(messages, self._seed(step, trajectories, index, attempt))
            )

        with ThreadPoolExecutor(max_workers=self.config.max_concurrency) as pool:
            return list(pool.map(analyze_one, range(len(trajectories))))

    def _complete(self, messages: Messages, seed: int) -> str:
        cfg = self.config
        body = json.dumps(
            {
                "model": cfg.model,
                "messages": messages,
                "temperature": cfg.temperature,
                "max_tokens": cfg.max_new_tokens,
                "seed": seed,
            }
        ).encode()
        jitter = random.Random(seed)  # an explicit seeded generator, never the global one
        problem = ""
        for retry in range(cfg.max_retries + 1):
            if retry:
                self._count("retries")
                time.sleep(cfg.retry_backoff_s * 2 ** (retry - 1) * (1.0 + jitter.random()))
            request = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
                    return _completion_text(json.loads(response.read()))
            except urllib.error.HTTPError as err:
                err.close()  # its body is never read: a server may echo the key there
                problem = f"HTTP {err.code}"
                if err.code not in _RETRYABLE_HTTP and err.code < 500:
                    raise AnalyzerRequestError(f"{problem} from {self._url}") from None
            except (OSError, http.client.HTTPException) as err:  # timeouts, refused/reset connections
                problem = (
                    type(err).__name__ if isinstance(err, TimeoutError) else f"{type(err).__name__}: {err}"
                )
            except (ValueError, KeyError, IndexError, TypeError):
                problem = "malformed response body"
        raise AnalyzerRequestError(f"{problem} from {self._url} after {cfg.max_retries + 1} tries")


class AnalyzerRequestError(RuntimeError):
    """The endpoint gave no usable answer (the message never contains the API key)."""


def _completion_text(payload: dict[str, Any]) -> str:
    content = payload["choices"][0]["message"]["content"]
    if content is not None and not isinstance(content, str):
        raise TypeError("message content is not a string")
    return content or ""


def to_openai_messages(messages: Messages) -> Messages:
    """Chat messages with PIL image items -> OpenAI content parts, images as base64 PNG data URLs."""
    out = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            content = [
                {"type": "image_url", "image_url": {"url": _data_url(item["image"])}}
                if item.get("type") == "image"
                else {"type": "text", "text": item["text"]}
                for item in content
            ]
        out.append({"role": message["role"], "content": content})
    return out


def _data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def make_analyzer(
    analyzer_config: AnalyzerConfig, env_config: EnvConfig, policy: Policy | None = None, seed: int = 0
) -> Analyzer:
    """The backend named by `analyzer.backend`; `self` needs the policy it analyzes with."""
    if analyzer_config.backend == "self":
        if policy is None:
            raise ValueError("analyzer backend 'self' needs the policy")
        return SelfAnalyzer(analyzer_config, policy, seed)
    if analyzer_config.backend == "external":
        return ExternalAnalyzer(analyzer_config, seed)
    return ScriptedAnalyzer(analyzer_config, env_config, seed)
