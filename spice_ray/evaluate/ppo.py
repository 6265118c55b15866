"""Single-task PPO: the paper's online-only sample-efficiency reference (any environment).

The paper (appendix "Proximal Policy Optimisation (PPO)") trains PPO from scratch on each test
task, with no pretraining, and "hyperparameters follow common practice (SB3 defaults in our
code)". Here each eval task gets its own stable-baselines3 ``PPO("MlpPolicy", ...)`` on a
:class:`spice_ray.envs.gym.TaskEnv` of that task, trained for a budget of ``episodes``
episodes of H = ``EvalConfig.online_horizon`` steps (``total_timesteps = episodes * H``). Every
episode starts at the task's start state, as in the online protocol, so the rewards PPO
collects *while training* are the online protocol's rewards, and episode k's regret is the
environment's (``Environment.regret``) of what PPO did in that episode.

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

from spice_ray.common.metrics import CUMULATIVE_REGRET, CUMULATIVE_RETURN
from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.envs.gym import TaskEnv
from spice_ray.evaluate.rows import concat_rows, tidy_rows

log = logging.getLogger(__name__)

METHOD = "PPO"
"""The ``method`` label of PPO rows (as in ``spice_ray.results``)."""
RULE = "ppo"
"""The ``rule`` of PPO rows."""
SB3_DEFAULT_N_STEPS = 2048
"""SB3 PPO's default rollout length: no policy update before this many steps."""
RESERVED_KWARGS = ("policy", "env", "seed", "device")
"""PPO arguments set here, not through ``ppo_kwargs``."""
INSTALL_HINT = "pip install -e '.[ppo]'"


def _import_ppo():
    """SB3's PPO, BaseCallback and Logger, or a clear ImportError naming the extra."""
    try:
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.logger import Logger
    except ImportError as exc:
        raise ImportError(
            "the PPO baseline needs stable-baselines3, an optional dependency: "
            f"install it with `{INSTALL_HINT}` (or `pip install 'stable-baselines3>=2.3'`)"
        ) from exc
    return PPO, BaseCallback, Logger


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


def train_ppo(
    env: Any,
    tasks: Any,
    index: int,
    horizon: int,
    episodes: int,
    seed: int,
    ppo_kwargs: Mapping[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train a fresh SB3 PPO on task ``index`` of ``tasks`` and return what it did.

    Args:
        env: the environment (``spice_ray.envs.Environment``); ``tasks``: a batch of its tasks.
        horizon: steps per episode H (the env truncates after H steps and SB3 resets it to
            the task's start).
        episodes: budget E; training stops after exactly E * H environment steps.
        seed: PPO's ``seed`` (python, numpy, torch and the env's seeds). The global python /
            numpy / torch RNG states that SB3 reseeds are restored afterwards.
        ppo_kwargs: extra ``PPO(...)`` arguments (SB3 defaults otherwise); not ``policy``,
            ``env``, ``seed`` or ``device``.

    Returns:
        (states [E*H, S], actions int64 [E*H], rewards float64 [E*H]) in step order; episode k
        (0-based) is ``[k*H:(k+1)*H]``.
    """
    PPO, BaseCallback, Logger = _import_ppo()
    kwargs = dict(ppo_kwargs or {})
    reserved = sorted(set(kwargs) & set(RESERVED_KWARGS))
    if reserved:
        raise ValueError(f"ppo_kwargs must not set {reserved}: they are fixed by the baseline")
    if episodes < 1 or horizon < 1:
        raise ValueError(f"episodes={episodes} and horizon={horizon} must be >= 1")
    budget = episodes * horizon

    class _Record(BaseCallback):
        """Records each env step (state, action, reward) and stops at the budget."""

        def __init__(self) -> None:
            super().__init__()
            self.steps: list[tuple[np.ndarray, int, float]] = []

        def _on_step(self) -> bool:
            info = self.locals["infos"][0]  # one env: index 0
            self.steps.append((info["state"], info["action"], float(self.locals["rewards"][0])))
            return self.num_timesteps < budget

    # SB3 reseeds the global python / legacy numpy / torch generators: put them back after.
    saved = random.getstate(), np.random.get_state(), torch.get_rng_state()  # noqa: NPY002
    try:
        model = PPO("MlpPolicy", TaskEnv(env, tasks, index, horizon), seed=seed, device="cpu",
                    **kwargs)
        # SB3's default logger makes an empty SB3-<date> folder in the temp directory per model
        model.set_logger(Logger(folder=None, output_formats=[]))
        recorder = _Record()
        model.learn(total_timesteps=budget, callback=recorder)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])  # noqa: NPY002
        torch.set_rng_state(saved[2])
    if len(recorder.steps) != budget:
        raise RuntimeError(f"PPO took {len(recorder.steps)} steps, expected the budget {budget}")
    states, actions, rewards = zip(*recorder.steps, strict=True)
    return (np.asarray(states, dtype=np.float64), np.asarray(actions, dtype=np.int64),
            np.asarray(rewards, dtype=np.float64))


def ppo_rows(
    data: Mapping[str, np.ndarray],
    env_cfg: EnvConfig,
    eval_cfg: EvalConfig,
    episodes: int,
    seed: int = 0,
    ppo_kwargs: dict | None = None,
) -> pd.DataFrame:
    """PPO from scratch on each eval task: regret (and return) of its first and last episode.

    For each task (a plain loop: a single-task reference), :func:`train_ppo` trains for
    ``episodes`` episodes of H = ``eval_cfg.online_horizon`` steps with seed
    ``SeedSequence([seed, task_id])``. What PPO did in its first and its last training episode
    gives the rows, as the online protocol's do for one episode: "cumulative_regret" (the
    environment's configured reading) and "cumulative_return", x = step 1..H within the
    episode, method "PPO", rule "ppo". ``config`` (:func:`ppo_config_json`) names the episode
    (1 or ``episodes``; one set of rows when ``episodes == 1``), the budget and the kwargs.

    SB3 defaults (``ppo_kwargs=None``) update only every 2048 steps, so budgets under 2048
    steps never update the policy (see the module docstring); set e.g. ``{"n_steps": 128}``.

    Args:
        data: eval-split columns (task_id and the environment's).
        env_cfg: the environment config.
        eval_cfg: online_horizon (H per episode). ``eval_cfg.episodes`` is not used: the
            budget is ``episodes``.
        episodes: training budget E in episodes (total_timesteps = E * H).
        seed: base seed, also the rows' ``seed`` (pass the paired checkpoint's training seed).
        ppo_kwargs: extra ``PPO(...)`` arguments, e.g. ``{"n_steps": 128, "batch_size": 64}``.

    Raises:
        ImportError: stable-baselines3 is missing (``pip install -e '.[ppo]'``).
    """
    _import_ppo()  # fail fast, before any work
    if episodes < 1:
        raise ValueError(f"episodes={episodes} is invalid: >= 1")
    kwargs = dict(ppo_kwargs or {})
    H = eval_cfg.online_horizon
    if kwargs.get("n_steps", SB3_DEFAULT_N_STEPS) >= episodes * H:
        log.warning("PPO n_steps=%d >= budget %d steps: the policy is never updated",
                    kwargs.get("n_steps", SB3_DEFAULT_N_STEPS), episodes * H)
    env = env_cfg.environment()
    task_ids = np.asarray(data["task_id"], dtype=np.int64)
    tasks = env.eval_tasks(data)
    runs = [train_ppo(env, tasks, i, H, episodes, task_seed(seed, int(tid)), kwargs)
            for i, tid in enumerate(task_ids)]
    steps = np.arange(1, H + 1)
    frames = []
    for episode in dict.fromkeys((1, episodes)):
        ep = slice((episode - 1) * H, episode * H)
        if runs:
            states = np.stack([r[0][ep] for r in runs])  # (B, H, S)
            actions = np.stack([r[1][ep] for r in runs])  # (B, H)
            rewards = np.stack([r[2][ep] for r in runs])  # (B, H)
        else:
            states = np.empty((0, H, env.state_dim))
            actions, rewards = np.empty((0, H), np.int64), np.empty((0, H))
        regret = env.regret(tasks, states, actions, rewards, H)
        config = ppo_config_json(episode, episodes, H, kwargs)
        for metric, values in ((CUMULATIVE_REGRET, np.cumsum(regret, axis=1)),
                               (CUMULATIVE_RETURN, np.cumsum(rewards, axis=1))):
            frames.append(tidy_rows(env_cfg.name, METHOD, RULE, config, seed, task_ids,
                                    metric, steps, values))
    return concat_rows(frames)
