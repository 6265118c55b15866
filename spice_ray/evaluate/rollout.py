"""Batched evaluation protocols (PROTOCOL.md) over all tasks at once, as tidy result rows.

* Bandit offline: suboptimality mu* - mu_{a_hat} of one pick from the first h context
  transitions, for >= 20 context lengths h. Learned models run one full forward over the eval
  contexts; position h's output is the prior (or the policy) given the first h transitions.
  SPICE's evidence for every h at once comes from prefix masks (uniform kernel), so nothing is
  recomputed per h; other kernels loop over h, each step vectorised over tasks.
* Bandit online: cumulative regret over H steps from an empty context, every controller driven
  by :func:`spice_ray.baselines.run_online_bandit` with common random numbers: the reward noise
  of (task, step) is ``TaskStreams.from_seed(eval_seed, "eval", task_ids).normal("online/noise",
  (H,))`` for every controller and every sigma of the robustness sweep (which reuses the same
  arm means).
* Darkroom online: each task starts from its eval-split start state with an empty context and
  acts H steps per episode (``EvalConfig.episodes`` episodes, the context kept across them);
  per-step regret r*_t - r_t against the optimal policy's reward sequence from the same start,
  and the cumulative return.

Rows are tidy: one value per (env, method, controller, config, seed, task_id, metric, x); see
:data:`ROW_COLUMNS`. Metric names and method labels (SPICE, DPT, AD-BC, UCB, ...) follow
``spice_ray.results.tables``: suboptimality, cumulative_regret, final_regret (robustness),
cumulative_return. ``seed`` is the training seed of the evaluated checkpoint (callers pass it;
baselines get the same value so that seeds pair up), ``config`` a compact JSON of the settings
that change a method's results, including the test-time ``sigma`` for bandits and
``episodes`` for darkroom. Randomised controllers (TS, DPT sampling, SPICE-Thompson) draw from
per-task :class:`~spice_ray.rng.StepDraws` keyed by (eval seed, task id, step), like the
environment noise: a task's rows do not depend on how tasks are sharded over actors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spice_ray.baselines.bandits import (
    cumulative_regret,
    make_baseline,
    offline_suboptimality,
    run_online_bandit,
)
from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.data.store import load_split
from spice_ray.envs import bandit, darkroom
from spice_ray.evaluate.controllers import (
    OFFLINE_METHODS,
    ONLINE_METHODS,
    Controller,
    ControllerSpec,
    context_evidence,
    fused_posterior,
    make_controller,
    needs_bootstrap,
    state_features,
)
from spice_ray.fusion import RandomSource, argmax_lowest, bootstrap_values, greedy_action
from spice_ray.model.tokens import Tokens, make_tokens
from spice_ray.model.trunk import TrunkModel
from spice_ray.rng import StepDraws, TaskStreams

log = logging.getLogger(__name__)

ROW_COLUMNS = ("env", "method", "controller", "config", "seed", "task_id", "metric", "x",
               "value")
KEY_COLUMNS = ROW_COLUMNS[:-1]
"""Columns that identify a row; a result table has each key at most once."""
NOISE_STREAM = "online/noise"
"""TaskStreams stream of the online reward noise (common random numbers)."""
CONTROLLER_STREAM = "online/controller"
"""StepDraws stream of randomised controllers' draws (Thompson noise, policy samples)."""


# ---- rows --------------------------------------------------------------------------------


def tidy_rows(
    env: str,
    method: str,
    controller: str,
    config: str,
    seed: int,
    task_ids: np.ndarray,
    metric: str,
    x: np.ndarray,
    values: np.ndarray,
) -> pd.DataFrame:
    """One row per (task, x): values [B, X] for task_ids [B] and x [X].

    Returns:
        DataFrame with :data:`ROW_COLUMNS`; seed, task_id and x are int64, value float64.
    """
    task_ids = np.asarray(task_ids, dtype=np.int64)
    x = np.asarray(x, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(task_ids), len(x)):
        raise ValueError(f"values has shape {values.shape}, expected {(len(task_ids), len(x))}")
    n = values.size

    def const(v: str) -> np.ndarray:
        return np.full(n, v, dtype=object)

    return pd.DataFrame({
        "env": const(env),
        "method": const(method),
        "controller": const(controller),
        "config": const(config),
        "seed": np.full(n, seed, dtype=np.int64),
        "task_id": np.repeat(task_ids, len(x)),
        "metric": const(metric),
        "x": np.tile(x, len(task_ids)),
        "value": values.reshape(-1),
    })


def concat_rows(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate row frames (an empty frame with :data:`ROW_COLUMNS` if there are none)."""
    frames = [f for f in frames if len(f)]
    if not frames:
        empty = np.empty((0, 0))
        return tidy_rows("", "", "", "", 0, np.empty(0), "", np.empty(0), empty)
    return pd.concat(frames, ignore_index=True)[list(ROW_COLUMNS)]


def duplicate_keys(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose key (:data:`KEY_COLUMNS`) occurs more than once."""
    return df[df.duplicated(list(KEY_COLUMNS), keep=False)]


# ---- inputs ------------------------------------------------------------------------------


def offline_context_lengths(horizon: int, num_points: int = 25) -> np.ndarray:
    """Context lengths h of the offline curve: log-spaced unique ints in [1, horizon].

    Always includes 1, 10, 50 and ``horizon`` where they fit, and at least
    ``min(num_points, horizon)`` values.

    Returns:
        int64 [P], sorted.
    """
    if horizon < 1:
        raise ValueError(f"horizon={horizon} is invalid: >= 1")
    want = min(num_points, horizon)
    anchors = [h for h in (1, 10, 50, horizon) if h <= horizon]
    n = want
    while True:
        hs = np.unique(np.concatenate([np.round(np.geomspace(1, horizon, n)), anchors]))
        if len(hs) >= want:
            return hs.astype(np.int64)
        n += 1


def online_noise(eval_seed: int, task_ids: np.ndarray, horizon: int) -> np.ndarray:
    """Standard-normal reward noise [B, H] per (task, step): the common random numbers."""
    return TaskStreams.from_seed(eval_seed, "eval", np.asarray(task_ids)).normal(
        NOISE_STREAM, (horizon,))


def controller_draws(eval_seed: int, task_ids: np.ndarray) -> StepDraws:
    """Fresh per-task draws for one randomised controller's run over ``task_ids``.

    Every controller gets the same draws (common random numbers), and a task's draws are a
    function of (eval seed, task id, step) only, whatever shard it is evaluated in.
    """
    return StepDraws(TaskStreams.from_seed(eval_seed, "eval", np.asarray(task_ids)),
                     CONTROLLER_STREAM)


def bandit_tasks(data: Mapping[str, np.ndarray], sigma: float) -> bandit.BanditTasks:
    """Eval-split bandit tasks (means [B, A]) at test noise ``sigma``."""
    return bandit.BanditTasks(np.asarray(data["means"], dtype=np.float64), float(sigma))


def darkroom_tasks(data: Mapping[str, np.ndarray], size: int) -> darkroom.DarkroomTasks:
    """Eval-split darkroom tasks: goals ``goal`` [B, 2], starts ``states[:, 0]`` [B, 2]."""
    return darkroom.DarkroomTasks(np.asarray(data["goal"], dtype=np.int64),
                                  np.asarray(data["states"][:, 0], dtype=np.int64), size)


def load_eval_tasks(ds_dir: str | Path, eval_cfg: EvalConfig) -> dict[str, np.ndarray]:
    """The first ``eval_cfg.num_tasks`` tasks of a dataset's eval split."""
    return load_split(ds_dir, "eval", limit=eval_cfg.num_tasks)


def _unique_specs(specs: Sequence[ControllerSpec], methods: tuple[str, ...],
                  eval_cfg: EvalConfig, online: bool) -> list[ControllerSpec]:
    """Specs applicable to a protocol, one per (method, rule, config) result key."""
    seen: set[tuple[str, str, str]] = set()
    out = []
    for spec in specs:
        if spec.method not in methods:
            log.debug("%s has no %s protocol; skipped", spec.method,
                      "online" if online else "offline")
            continue
        key = (spec.method, spec.rule(online), spec.config_json(eval_cfg, online))
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


# ---- full forward over fixed contexts ----------------------------------------------------


def _slice_tokens(tokens: Tokens, sl: slice) -> Tokens:
    return Tokens(**{name: getattr(tokens, name)[sl] for name in Tokens.__dataclass_fields__})


@torch.no_grad()
def sequence_outputs(
    model: TrunkModel,
    tokens: Tokens,
    positions: np.ndarray,
    keep_latents: bool = False,
    keep_prior_means: bool = False,
    batch_size: int = 32,
) -> dict[str, Tensor]:
    """One full forward over [query; context] per task (in chunks of tasks), on the CPU.

    Args:
        model: SpiceModel or DptModel.
        tokens: B contexts of length T.
        positions: int [P] positions 0..T to read the heads at (position h saw h transitions).
        keep_latents: also return every position's latent.
        keep_prior_means: also return every position's prior mean (SPICE).
        batch_size: tasks per forward (bounds the [K, B*T*A, hidden] ensemble activations).

    Returns:
        The heads' fields at ``positions`` ([B, P, A]: "logits", and for SPICE "prior_mean",
        "prior_std"); "latent" [B, T+1, D] and "prior_mean_all" [B, T+1, A] when asked.
    """
    model.eval()
    device = model.trunk.embed.weight.device
    pos = torch.as_tensor(np.asarray(positions, dtype=np.int64))
    parts: dict[str, list[Tensor]] = {}
    for lo in range(0, tokens.batch_size, batch_size):
        chunk = _slice_tokens(tokens, slice(lo, lo + batch_size)).to(device)
        latent = model.trunk.encode(chunk)  # (b, T+1, D)
        head = model.heads(latent[:, pos.to(device)])  # fields (b, P, ...)
        got = {name: getattr(head, name) for name in ("logits", "prior_mean", "prior_std")
               if hasattr(head, name)}
        if keep_latents:
            got["latent"] = latent
        if keep_prior_means:
            got["prior_mean_all"] = model.heads(latent).prior_mean  # (b, T+1, A)
        for name, value in got.items():
            parts.setdefault(name, []).append(value.cpu())
    return {name: torch.cat(values) for name, values in parts.items()}


# ---- bandit offline ----------------------------------------------------------------------


def spice_offline_picks(
    spec: ControllerSpec,
    outputs: Mapping[str, Tensor],
    actions: Tensor,
    rewards: Tensor,
    hs: np.ndarray,
    num_actions: int,
    model: TrunkModel | None = None,
) -> Tensor:
    """SPICE's greedy offline pick argmax_a m_post after the first h transitions, every h.

    Args:
        spec: a spice spec (its fusion config).
        outputs: :func:`sequence_outputs` at positions ``hs`` (with "prior_mean_all" when the
            targets bootstrap).
        actions: long [B, T] context actions.
        rewards: [B, T] context rewards.
        hs: int [P] context lengths.
        num_actions: A.
        model: the SpiceModel; needed by latent-space kernels (:func:`state_features`).

    Returns:
        long [B, P] picks.
    """
    f = spec.fusion
    B, T = actions.shape
    P = len(hs)
    next_values = None
    if needs_bootstrap(f):
        next_values = bootstrap_values(outputs["prior_mean_all"][:, 1:], f.bootstrap)  # (B, T)
    if f.kernel == "uniform":
        # All prefixes at once: prefix masks [P, T] over the broadcast context [B, P, T].
        mask = torch.arange(T)[None, :] < torch.as_tensor(hs)[:, None]  # (P, T)
        expand = (B, P, T)
        counts, mean = context_evidence(
            f, actions[:, None].expand(expand), rewards[:, None].expand(expand), num_actions,
            next_values=None if next_values is None else next_values[:, None].expand(expand),
            mask=mask.expand(expand))  # (B, P, A) each
    else:  # the weights depend on the query latent at h: one vectorised step per h
        stats = []
        for h in (int(v) for v in hs):
            query, context = torch.zeros(B, 1), torch.zeros(B, h, 1)  # bandit states: zero
            if f.kernel_space == "latent":
                if model is None:
                    raise ValueError("a latent-space kernel needs the model")
                query, context = state_features(model, query), state_features(model, context)
            stats.append(context_evidence(
                f, actions[:, :h], rewards[:, :h], num_actions, query, context,
                None if next_values is None else next_values[:, :h]))
        counts = torch.stack([c for c, _ in stats], 1)  # (B, P, A)
        mean = torch.stack([m for _, m in stats], 1)  # (B, P, A)
    post = fused_posterior(f, outputs["prior_mean"], outputs["prior_std"], counts, mean)
    return greedy_action(post.mean)  # (B, P)


def bandit_offline_rows(
    env: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[ControllerSpec],
    model: TrunkModel | None = None,
    seed: int = 0,
    hs: np.ndarray | None = None,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Offline suboptimality vs context length h (metric "suboptimality", x = h).

    Args:
        env: the bandit config (A, and sigma for the TS baseline and the rows).
        eval_cfg: offline_points and the baseline constants.
        data: eval-split columns of B tasks: task_id, means, actions, rewards,
            behaviour_probs, label.
        specs: controllers; those without an offline rule (ucb, optimal) are skipped, and SPICE
            specs that differ only in online settings share one curve.
        model: the checkpoint for spice / dpt / ad-bc specs.
        seed: the checkpoint's training seed (the rows' ``seed``).
        hs: context lengths (default :func:`offline_context_lengths`).
        batch_size: tasks per model forward.
    """
    A = env.num_arms
    actions = torch.as_tensor(np.asarray(data["actions"], dtype=np.int64))  # (B, T)
    rewards = torch.as_tensor(np.asarray(data["rewards"], dtype=np.float64))  # (B, T)
    means = np.asarray(data["means"], dtype=np.float64)
    task_ids = np.asarray(data["task_id"])
    T = actions.shape[1]
    hs = offline_context_lengths(T, eval_cfg.offline_points) if hs is None else np.asarray(hs)
    if hs.min() < 0 or hs.max() > T:
        raise ValueError(f"context lengths must lie in [0, {T}]")
    todo = _unique_specs(specs, OFFLINE_METHODS, eval_cfg, online=False)
    outputs: dict[str, Tensor] | None = None
    model_specs = [s for s in todo if s.uses_model]
    if model_specs:
        if model is None:
            raise ValueError(f"{model_specs[0].method} needs a model")
        tokens = make_tokens(data, "bandit", A)
        spice = [s for s in model_specs if s.method == "spice"]
        outputs = sequence_outputs(model, tokens, hs,
                                   keep_prior_means=any(needs_bootstrap(s.fusion) for s in spice),
                                   batch_size=batch_size)
    frames = []
    for spec in todo:
        if spec.method == "spice":
            assert outputs is not None
            if "prior_mean" not in outputs:
                raise ValueError("method 'spice' needs a SpiceModel (a value ensemble)")
            picks = spice_offline_picks(spec, outputs, actions, rewards, hs, A, model)
        elif spec.uses_model:
            assert outputs is not None
            picks = argmax_lowest(outputs["logits"])  # (B, P): greedy at position h
        else:
            base = make_baseline(spec.method, eval_cfg, env.sigma)
            picks = torch.stack([base.offline_pick(actions[:, :h], rewards[:, :h], A)
                                 for h in (int(v) for v in hs)], 1)  # (B, P)
        subopt = np.stack([offline_suboptimality(means, picks[:, i]) for i in range(len(hs))],
                          1)  # (B, P)
        frames.append(tidy_rows(env.name, spec.label, spec.rule(online=False),
                                spec.config_json(eval_cfg, online=False, sigma=env.sigma),
                                seed, task_ids, "suboptimality", hs, subopt))
    return concat_rows(frames)


# ---- bandit online -----------------------------------------------------------------------


def bandit_online_rows(
    env: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[ControllerSpec],
    model: TrunkModel | None = None,
    seed: int = 0,
    sigmas: Sequence[float] | None = None,
    final_sigmas: Sequence[float] = (),
) -> pd.DataFrame:
    """Online regret from an empty context at each test sigma.

    Metrics: "cumulative_regret" at x = step 1..H for each of ``sigmas``, and "final_regret"
    (the cumulative regret after H steps, x = H) for each of ``final_sigmas`` (the robustness
    sweep). A sigma in both lists is run once. Every controller and every sigma sees the same
    standard-normal noise per (task, step) (:func:`online_noise`), so rewards differ only
    through the actions and sigma.

    Args:
        env: the bandit config.
        eval_cfg: online_horizon, seed (of the noise streams), baseline constants.
        data: eval-split columns: task_id, means.
        specs: controllers; those without an online rule (lcb) are skipped.
        model: the checkpoint for spice / dpt / ad-bc specs.
        seed: the checkpoint's training seed (the rows' ``seed``).
        sigmas: test-time noise stds of the full curves (default: ``(env.sigma,)``).
        final_sigmas: test-time noise stds of the final-regret rows.
    """
    task_ids = np.asarray(data["task_id"])
    H = eval_cfg.online_horizon
    noise = online_noise(eval_cfg.seed, task_ids, H)  # (B, H)
    curves = [float(s) for s in ((env.sigma,) if sigmas is None else sigmas)]
    finals = [float(s) for s in final_sigmas]
    todo = _unique_specs(specs, ONLINE_METHODS, eval_cfg, online=True)
    frames = []
    steps = np.arange(1, H + 1)
    for sigma in dict.fromkeys(curves + finals):
        tasks = bandit_tasks(data, sigma)
        for spec in todo:
            ctrl = make_controller(spec, "bandit", model, eval_cfg, sigma, tasks)
            actions, _ = run_online_bandit(ctrl, tasks.means, sigma, noise,
                                           controller_draws(eval_cfg.seed, task_ids))
            regret = cumulative_regret(tasks.means, actions)  # (B, H)
            config = spec.config_json(eval_cfg, sigma=sigma)
            if sigma in curves:
                frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed,
                                        task_ids, "cumulative_regret", steps, regret))
            if sigma in finals:
                frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed,
                                        task_ids, "final_regret", steps[-1:], regret[:, -1:]))
    return concat_rows(frames)


# ---- darkroom online ---------------------------------------------------------------------


def run_online_darkroom(
    controller: Controller,
    tasks: darkroom.DarkroomTasks,
    horizon: int,
    episodes: int = 1,
    generator: RandomSource | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Act ``episodes`` episodes of ``horizon`` steps from each task's start, context kept.

    Args:
        controller: follows :class:`Controller`; gets the current states in ``act``.
        tasks: B darkroom tasks (goals, starts).
        horizon: steps per episode.
        episodes: episodes per run; each restarts at the task's start state.
        generator: handed to ``controller.reset``.

    Returns:
        (actions int64 [B, E*H], rewards float64 [B, E*H]).
    """
    B = tasks.num_tasks
    controller.reset(B, darkroom.NUM_ACTIONS, generator)
    actions = np.empty((B, episodes * horizon), dtype=np.int64)
    rewards = np.empty((B, episodes * horizon), dtype=np.float64)
    t = 0
    for _ in range(episodes):
        states = darkroom.reset(tasks)  # (B, 2)
        for _ in range(horizon):
            s = torch.from_numpy(states)
            a = controller.act(t, s)  # (B,)
            actions[:, t] = a.cpu().numpy()
            nxt, rewards[:, t] = darkroom.step(tasks, states, actions[:, t])
            controller.observe(torch.from_numpy(actions[:, t]), torch.from_numpy(rewards[:, t]),
                               s, torch.from_numpy(nxt))
            states = nxt
            t += 1
    return actions, rewards


def darkroom_online_rows(
    env: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[ControllerSpec],
    model: TrunkModel | None = None,
    seed: int = 0,
) -> pd.DataFrame:
    """Darkroom online: metrics "cumulative_regret" and "cumulative_return", x = step 1..E*H.

    The regret at step t is r*_t - r_t with r*_t from
    :func:`spice_ray.envs.darkroom.optimal_rewards` (the optimal policy from the same start,
    repeated per episode).

    Args:
        env: the darkroom config (grid_size).
        eval_cfg: online_horizon, episodes, seed.
        data: eval-split columns: task_id, goal, states (``states[:, 0]`` is the start).
        specs: spice, dpt, ad-bc or optimal specs.
        model: the checkpoint for the learned specs.
        seed: the checkpoint's training seed (the rows' ``seed``).
    """
    task_ids = np.asarray(data["task_id"])
    tasks = darkroom_tasks(data, env.grid_size)
    H, E = eval_cfg.online_horizon, eval_cfg.episodes
    best = np.tile(darkroom.optimal_rewards(tasks, H), (1, E))  # (B, E*H)
    steps = np.arange(1, E * H + 1)
    frames = []
    for spec in _unique_specs(specs, ONLINE_METHODS, eval_cfg, online=True):
        ctrl = make_controller(spec, "darkroom", model, eval_cfg, tasks=tasks)
        _, rewards = run_online_darkroom(ctrl, tasks, H, E,
                                         controller_draws(eval_cfg.seed, task_ids))
        config = spec.config_json(eval_cfg, episodes=E)
        for metric, values in (("cumulative_regret", np.cumsum(best - rewards, axis=1)),
                               ("cumulative_return", np.cumsum(rewards, axis=1))):
            frames.append(tidy_rows(env.name, spec.label, spec.rule(), config, seed, task_ids,
                                    metric, steps, values))
    return concat_rows(frames)

