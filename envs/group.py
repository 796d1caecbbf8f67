"""EnvGroup: the environments of one rollout, `group_size` per task, every member of a group starting from
the same seed (hence the identical initial state that GRPO's group baseline needs).

Task seeds come from disjoint ranges: training task t of update step s plays seed
`train_seed_start + s * num_tasks + t`, evaluation task t plays `eval_seed_start + t` at every evaluation
(the same tasks each time, so evaluations compare), and a training seed that would reach `eval_seed_start`
is an error. With `parallel_workers > 1` environments reset and step in a thread pool; each has its own
state and generators, so the results are identical to sequential stepping. (Threads, not processes: these
games step in microseconds, less than a process round trip costs; threads help engines that release the GIL.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from seed_vl.config import ConfigError, EnvConfig
from seed_vl.envs.base import Observation, StepResult
from seed_vl.envs.registry import make_env

T = TypeVar("T")
Split = Literal["train", "eval"]


def task_seed(env_config: EnvConfig, split: Split, step: int, num_tasks: int, task: int) -> int:
    if split == "eval":
        return env_config.eval_seed_start + task
    seed = env_config.train_seed_start + step * num_tasks + task
    if seed >= env_config.eval_seed_start:
        raise ConfigError(
            f"env.eval_seed_start: training seed {seed} (step {step}, task {task}) reaches the evaluation "
            f"range starting at {env_config.eval_seed_start}; raise env.eval_seed_start"
        )
    return seed


class EnvGroup:
    """Environment i belongs to task `group_ids[i]` and starts from `seeds[i]`. `task_indices` picks this
    process's share of the step's `num_tasks` tasks (default: all of them)."""

    def __init__(
        self,
        env_config: EnvConfig,
        *,
        num_tasks: int,
        group_size: int,
        split: Split = "train",
        step: int = 0,
        task_indices: Iterable[int] | None = None,
    ) -> None:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        tasks = list(range(num_tasks)) if task_indices is None else list(task_indices)
        if any(not 0 <= t < num_tasks for t in tasks):
            raise ValueError(f"task_indices must lie in [0, {num_tasks}), got {tasks}")
        group_ids = [t for t in tasks for _ in range(group_size)]
        self._setup(
            env_config,
            seeds=[task_seed(env_config, split, step, num_tasks, t) for t in group_ids],
            group_ids=group_ids,
            # Every episode's index in the whole batch, whichever process plays it: sampling seeds follow it.
            episode_ids=[t * group_size + k for t in tasks for k in range(group_size)],
        )

    @classmethod
    def of_seeds(cls, env_config: EnvConfig, seeds: Iterable[int]) -> EnvGroup:
        """One episode per seed, each its own group: scripted play outside the train/eval schedule."""
        seeds = list(seeds)
        indices = list(range(len(seeds)))
        group = cls.__new__(cls)
        group._setup(env_config, seeds=seeds, group_ids=indices, episode_ids=indices)
        return group

    def _setup(
        self, env_config: EnvConfig, *, seeds: list[int], group_ids: list[int], episode_ids: list[int]
    ) -> None:
        self.env_name = env_config.name
        self.seeds, self.group_ids, self.episode_ids = seeds, group_ids, episode_ids
        self.envs = [make_env(env_config) for _ in seeds]
        self.parallel_workers = env_config.parallel_workers

    def __len__(self) -> int:
        return len(self.envs)

    def reset(self) -> list[tuple[Observation, dict[str, Any]]]:
        return self._map(lambda i: self.envs[i].reset(self.seeds[i]), range(len(self.envs)))

    def step(self, actions: Mapping[int, str | None]) -> dict[int, StepResult]:
        """Step only the environments named in `actions` (the live episodes); returns their results."""
        indices = list(actions)
        return dict(zip(indices, self._map(lambda i: self.envs[i].step(actions[i]), indices), strict=True))

    def _map(self, fn: Callable[[int], T], indices: Iterable[int]) -> list[T]:
        indices = list(indices)
        if self.parallel_workers <= 1 or len(indices) <= 1:
            return [fn(i) for i in indices]
        with ThreadPoolExecutor(self.parallel_workers) as pool:
            return list(pool.map(fn, indices))
