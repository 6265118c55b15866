"""Single-task PPO on Darkroom: the paper's online-only sample-efficiency reference.

The paper (appendix "Proximal Policy Optimisation (PPO)") trains PPO from scratch on each test
task, with no pretraining, and "hyperparameters follow common practice (SB3 defaults in our
code)". Here each eval task gets its own stable-baselines3 ``PPO("MlpPolicy", ...)`` on a
:class:`spice_ray.envs.gym.DarkroomEnv` of that task, trained for a budget of ``episodes``
episodes of H = ``EvalConfig.online_horizon`` steps (``total_timesteps = episodes * H``). Every
episode starts at the task's start state (PROTOCOL.md), so the rewards PPO collects *while
training* are the online protocol's rewards: episode k's per-step regret is r*_t - r_t with
r*_t from :func:`spice_ray.envs.darkroom.optimal_rewards`.

**SB3 defaults and small budgets.** SB3's PPO updates the policy once per rollout of
``n_steps`` steps (default 2048). In a few-episode budget (episodes * H < 2048, e.g. 20
episodes of 100 steps) no update happens at all, so every recorded episode is the initial,
near-uniform stochastic policy. That is what "SB3 defaults" gives; pass ``ppo_kwargs`` (e.g.
``{"n_steps": 128, "batch_size": 64}``) for a PPO that learns inside the budget. With
``n_steps = N`` the policy is updated after steps N, 2N, ... of the budget (collection stops
exactly at the budget; SB3's update after the final rollout is skipped because nothing is
recorded after it).

stable-baselines3 is an optional dependency (``pip install -e '.[ppo]'``), imported only
inside the functions here.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch

from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.envs import darkroom
from spice_ray.envs.gym import DarkroomEnv
from spice_ray.evaluate.rollout import concat_rows, darkroom_tasks, tidy_rows

log = logging.getLogger(__name__)

METHOD = "PPO"
"""The ``method`` label of PPO rows (as in ``spice_ray.results``)."""
CONTROLLER = "ppo"
"""The ``controller`` of PPO rows."""
SB3_DEFAULT_N_STEPS = 2048
"""SB3 PPO's default rollout length: no policy update before this many steps."""
RESERVED_KWARGS = ("policy", "env", "seed", "device")
"""PPO arguments set here, not through ``ppo_kwargs``."""
INSTALL_HINT = "pip install -e '.[ppo]'"


def _import_ppo():
    """SB3's PPO and BaseCallback, or a clear ImportError naming the extra."""
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
    except ImportError as exc:
        raise ImportError(
            "the PPO baseline needs stable-baselines3, an optional dependency: "
            f"install it with `{INSTALL_HINT}` (or `pip install 'stable-baselines3>=2.3'`)"
        ) from exc
    return PPO, BaseCallback


def task_seed(seed: int, task_id: int) -> int:
    """PPO's seed for one task: from ``numpy.random.SeedSequence([seed, task_id])``, in
    [0, 2**32) as ``np.random.seed`` (called by SB3) requires."""
    return int(np.random.SeedSequence([seed, task_id]).generate_state(1, np.uint32)[0])


def _json_default(obj: Any) -> str:
    """JSON fallback for ppo_kwargs values such as ``policy_kwargs={"activation_fn": nn.Tanh}``."""
    if isinstance(obj, type) or callable(obj):
        return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"
    return repr(obj)


def ppo_config_json(episode: int, episodes: int, horizon: int,
                    ppo_kwargs: Mapping[str, Any]) -> str:
    """The rows' ``config``: which training episode (1-based), the budget, the PPO kwargs."""
    return json.dumps({"episode": episode, "budget_episodes": episodes,
                       "total_timesteps": episodes * horizon, "ppo": dict(ppo_kwargs)},
                      sort_keys=True, separators=(",", ":"), default=_json_default)


def train_ppo_darkroom(
    goal: tuple[int, int],
    start: tuple[int, int],
    size: int,
    horizon: int,
    episodes: int,
    seed: int,
    ppo_kwargs: Mapping[str, Any] | None = None,
) -> np.ndarray:
    """Train a fresh SB3 PPO on one Darkroom task and return every training step's reward.

    Args:
        goal, start: the task's cells (x, y).
        size: grid side length.
        horizon: steps per episode H (the env truncates after H steps and SB3 resets it to
            ``start``).
        episodes: budget E; training stops after exactly E * H environment steps.
        seed: PPO's ``seed`` (python, numpy, torch and the env's seeds). The global python /
            numpy / torch RNG states that SB3 reseeds are restored afterwards.
        ppo_kwargs: extra ``PPO(...)`` arguments (SB3 defaults otherwise); not ``policy``,
            ``env``, ``seed`` or ``device``.

    Returns:
        float64 [E * H] rewards in step order; episode k (0-based) is ``[k*H:(k+1)*H]``.
    """
    PPO, BaseCallback = _import_ppo()
    kwargs = dict(ppo_kwargs or {})
    reserved = sorted(set(kwargs) & set(RESERVED_KWARGS))
    if reserved:
        raise ValueError(f"ppo_kwargs must not set {reserved}: they are fixed by the baseline")
    if episodes < 1 or horizon < 1:
        raise ValueError(f"episodes={episodes} and horizon={horizon} must be >= 1")
    budget = episodes * horizon

    class _RecordRewards(BaseCallback):
        """Records each env step's reward and stops collection at the budget."""

        def __init__(self) -> None:
            super().__init__()
            self.rewards: list[float] = []

        def _on_step(self) -> bool:
            self.rewards.append(float(self.locals["rewards"][0]))  # one env: index 0
            return self.num_timesteps < budget

    # SB3 reseeds the global python / legacy numpy / torch generators: put them back after.
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
    try:
        env = DarkroomEnv(tuple(int(v) for v in goal), tuple(int(v) for v in start), size,
                          horizon)
        model = PPO("MlpPolicy", env, seed=seed, device="cpu", **kwargs)
        recorder = _RecordRewards()
        model.learn(total_timesteps=budget, callback=recorder)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])  # noqa: NPY002
        torch.set_rng_state(saved[2])
    rewards = np.asarray(recorder.rewards, dtype=np.float64)
    if rewards.shape != (budget,):
        raise RuntimeError(f"PPO took {rewards.size} steps, expected the budget {budget}")
    return rewards


def ppo_darkroom_rows(
    data: Mapping[str, np.ndarray],
    env_cfg: EnvConfig,
    eval_cfg: EvalConfig,
    episodes: int,
    seed: int = 0,
    ppo_kwargs: dict | None = None,
) -> pd.DataFrame:
    """PPO from scratch on each eval task: regret and return of its first and last episode.

    For each task (a plain loop: a single-task reference), :func:`train_ppo_darkroom` trains
    for ``episodes`` episodes of H = ``eval_cfg.online_horizon`` steps with seed
    ``SeedSequence([seed, task_id])``. The rewards PPO collects in its first and its last
    training episode give the rows, as :func:`spice_ray.evaluate.rollout.darkroom_online_rows`
    does for one episode: metrics "cumulative_regret" (cumsum of r*_t - r_t, r*_t the optimal
    policy's reward from the same start) and "cumulative_return", x = step 1..H within the
    episode, method "PPO", controller "ppo". ``config`` (:func:`ppo_config_json`) names the
    episode (1 or ``episodes``; one set of rows when ``episodes == 1``), the budget and the
    PPO kwargs.

    SB3 defaults (``ppo_kwargs=None``) update only every 2048 steps, so budgets under 2048
    steps never update the policy (see the module docstring); set e.g. ``{"n_steps": 128}``.

    Args:
        data: eval-split columns: task_id, goal, states (``states[:, 0]`` is the start).
        env_cfg: the darkroom config (grid_size, name).
        eval_cfg: online_horizon (H per episode). ``eval_cfg.episodes`` is not used: the
            budget is ``episodes``.
        episodes: training budget E in episodes (total_timesteps = E * H).
        seed: base seed, also the rows' ``seed`` (pass the paired checkpoint's training seed).
        ppo_kwargs: extra ``PPO(...)`` arguments, e.g. ``{"n_steps": 128, "batch_size": 64}``.

    Returns:
        Tidy rows (:data:`spice_ray.evaluate.rollout.ROW_COLUMNS`).

    Raises:
        ImportError: stable-baselines3 is missing (``pip install -e '.[ppo]'``).
    """
    _import_ppo()  # fail fast, before any work
    if env_cfg.name != "darkroom":
        raise ValueError(f"the PPO baseline runs on darkroom, not {env_cfg.name!r}")
    if episodes < 1:
        raise ValueError(f"episodes={episodes} is invalid: >= 1")
    kwargs = dict(ppo_kwargs or {})
    H = eval_cfg.online_horizon
    if kwargs.get("n_steps", SB3_DEFAULT_N_STEPS) >= episodes * H:
        log.warning("PPO n_steps=%d >= budget %d steps: the policy is never updated",
                    kwargs.get("n_steps", SB3_DEFAULT_N_STEPS), episodes * H)
    task_ids = np.asarray(data["task_id"], dtype=np.int64)
    tasks = darkroom_tasks(data, env_cfg.grid_size)
    best = darkroom.optimal_rewards(tasks, H)  # (B, H): the same every episode
    rewards = np.stack([
        train_ppo_darkroom(tasks.goals[i], tasks.starts[i], tasks.size, H, episodes,
                           task_seed(seed, int(tid)), kwargs)
        for i, tid in enumerate(task_ids)
    ]) if len(task_ids) else np.empty((0, episodes * H))  # (B, E*H)
    steps = np.arange(1, H + 1)
    frames = []
    for episode in dict.fromkeys((1, episodes)):
        ep = rewards[:, (episode - 1) * H:episode * H]  # (B, H)
        config = ppo_config_json(episode, episodes, H, kwargs)
        for metric, values in (("cumulative_regret", np.cumsum(best - ep, axis=1)),
                               ("cumulative_return", np.cumsum(ep, axis=1))):
            frames.append(tidy_rows(env_cfg.name, METHOD, CONTROLLER, config, seed, task_ids,
                                    metric, steps, values))
    return concat_rows(frames)
