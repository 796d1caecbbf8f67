"""Episode mode (`rollout.history_window=episode`): one chat per episode, each turn's context extending the
previous one, and all its turns scored in one forward over the episode's sequence."""

from __future__ import annotations

import random

import pytest
import torch

from seed_vl.config import ConfigError, EnvConfig, load_config
from seed_vl.policy import Policy, _prefix_chains
from seed_vl.processors.prompts import TASK_PREFIX
from seed_vl.skills import SKILL_HEADER, insert_skill
from seed_vl.toy.demonstrations import play_demonstrations
from seed_vl.trainer import Trainer

TOL = 1e-5


def _longest_demonstration(env_name: str, images):
    episodes = play_demonstrations(
        EnvConfig(name=env_name, cell_px=28), 6, seed=0, history_window="episode", image_settings=images,
        rng=random.Random(0),
    )
    episode = max(episodes, key=lambda e: e.length)
    assert episode.length >= 4
    return episode


def _episode_turns(policy: Policy, env_name: str):
    """A solver episode played in episode mode: (contexts, response token ids) of its turns."""
    episode = _longest_demonstration(env_name, policy.image_settings)
    responses = [policy.tokenizer.encode(t.response_text, add_special_tokens=False) for t in episode.turns]
    return [t.context for t in episode.turns], responses


def _text(content) -> str:
    return content if isinstance(content, str) else "".join(i.get("text", "") for i in content)


def test_each_turn_extends_the_previous_turn_and_its_answer(vl_policy):
    turns = _longest_demonstration("sokoban_visual", None).turns
    for k, (turn, following) in enumerate(zip(turns, turns[1:], strict=False)):
        assert following.context[: len(turn.context)] == turn.context
        answer, observation = following.context[len(turn.context) :]
        assert answer == {"role": "assistant", "content": turn.response_text}
        assert _text(observation["content"]).startswith(f"Step {k + 1}: you took '{turn.action}'")
        assert f"(step {k + 2})" in _text(observation["content"])
        assert sum(item["type"] == "image" for item in observation["content"]) == 1
    last = turns[-1].context
    assert [m["role"] for m in last] == ["system"] + ["user", "assistant"] * (len(turns) - 1) + ["user"]
    assert sum(TASK_PREFIX in _text(m["content"]) for m in last) == 1  # the task line, in the first user message
    with_skill = insert_skill(last, "push right first")
    assert SKILL_HEADER in _text(with_skill[1]["content"]) and with_skill[2:] == last[2:]


@pytest.mark.parametrize(("policy_name", "env_name"), [("vl_policy", "sokoban_visual"), ("text_policy", "sokoban_text")])
def test_one_sequence_scores_equal_each_turn_scored_over_its_own_prefix(request, policy_name, env_name):
    policy = request.getfixturevalue(policy_name)
    contexts, responses = _episode_turns(policy, env_name)
    prompts = policy._encode_contexts(contexts)[0]
    assert _prefix_chains(prompts, responses) == [list(range(len(contexts)))]  # one sequence: packed
    packed = policy.score(contexts, responses, micro_batch_size=len(contexts))
    for k, (context, response) in enumerate(zip(contexts, responses, strict=True)):
        alone = policy.score([context], [response], micro_batch_size=1)
        torch.testing.assert_close(packed.logprobs[k], alone.logprobs[0], atol=TOL, rtol=0)
        torch.testing.assert_close(packed.entropies[k], alone.entropies[0], atol=TOL, rtol=0)
    # A skill inserted in every turn keeps the turns one sequence; a chain also continues across a
    # micro-batch boundary's two halves, each scored as its own row.
    skilled = [insert_skill(c, "push the box right first") for c in contexts]
    assert _prefix_chains(policy._encode_contexts(skilled)[0], responses) == [list(range(len(contexts)))]
    halves = policy.score(contexts, responses, micro_batch_size=2)
    for a, b in zip(halves.logprobs, packed.logprobs, strict=True):
        torch.testing.assert_close(a, b, atol=TOL, rtol=0)


def test_one_sequence_gradients_equal_the_per_turn_sum(text_policy):
    contexts, responses = _episode_turns(text_policy, "sokoban_text")
    params = [p for p in text_policy.model.parameters() if p.requires_grad]

    def gradients(micro_batch_size: int) -> list[torch.Tensor]:
        text_policy.model.zero_grad()
        for _, logprobs, _ in text_policy.score_batches(
            contexts, responses, micro_batch_size, with_grad=True, return_entropy=False
        ):
            torch.cat(logprobs).sum().backward()
        return [p.grad.clone() for p in params]

    for packed, alone in zip(gradients(len(contexts)), gradients(1), strict=True):
        torch.testing.assert_close(packed, alone, atol=1e-4, rtol=1e-4)
    text_policy.model.zero_grad()


def test_other_contexts_are_scored_as_rows_of_their_own(vl_policy):
    contexts, responses = _episode_turns(vl_policy, "sokoban_visual")
    reordered = [contexts[2], contexts[0], contexts[1]]
    prompts = vl_policy._encode_contexts(reordered)[0]
    assert _prefix_chains(prompts, [responses[2], responses[0], responses[1]]) == [[0], [1, 2]]
    # A response that is not what the next context shows breaks the chain there.
    other = [[*responses[0][:-1], responses[0][-1] + 1], responses[1]]
    assert _prefix_chains(vl_policy._encode_contexts(contexts[:2])[0], other) == [[0], [1]]


def test_a_training_step_in_episode_mode_keeps_episodes_whole(tiny_vl_path, tmp_path):
    config = load_config(None, [
        f"model.path={tiny_vl_path}", "model.device=cpu", "env.name=sokoban_visual", "env.cell_px=28",
        "env.max_steps=3", "rollout.num_tasks=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "rollout.history_window=episode", "analyzer.backend=scripted", "train.steps=1",
        "train.mini_batch_size=4", "train.micro_batch_size=4", f"train.output_dir={tmp_path}",
        "eval.num_tasks=1", "logging.progress=false",
    ])
    trainer = Trainer(config)
    trajectories = trainer.rollout(step=1)
    assert all(len(t.turns[-1].context) == 2 * t.length for t in trajectories)  # system + one chat over all turns
    samples = trainer._action_samples(trajectories)
    order = trainer._minibatch_order(samples, torch.Generator().manual_seed(0))
    episodes = [samples[k].episode for k in order]
    assert sorted(order) == list(range(len(samples)))
    runs = [e for k, e in enumerate(episodes) if k == 0 or e != episodes[k - 1]]
    assert len(runs) == len(set(episodes)) == len(trajectories)  # each episode one run, its turns in order
    assert all(a < b for a, b in zip(order, order[1:], strict=False) if samples[a].episode == samples[b].episode)
    metrics = trainer.learn(1, trajectories)
    assert torch.isfinite(torch.tensor(metrics["loss"]))


@pytest.mark.parametrize("value", ["-1", "all", "true"])
def test_a_history_window_that_is_neither_turns_nor_episode_is_one_clear_error(value):
    with pytest.raises(ConfigError, match="rollout.history_window: expected a number of turns >= 0 or 'episode'"):
        load_config(None, [f"rollout.history_window={value}"])
