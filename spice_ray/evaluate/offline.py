"""The offline protocol (stateless environments): one pick from a fixed context.

Suboptimality max_a v_a - v_{a_hat} of one pick from the first h context transitions, for
>= 20 context lengths h (log-spaced). Learned models run one full forward over the eval
contexts; position h's output is the prior (or the policy) given the first h transitions.
SPICE's evidence for every h at once comes from prefix masks (uniform kernel), so nothing is
recomputed per h; other kernels loop over h, each step vectorised over tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from spice_ray.agents import AgentSpec, OfflineContexts, OfflinePicker, make_agent
from spice_ray.common.metrics import SUBOPTIMALITY
from spice_ray.common.rng import TaskStreams
from spice_ray.config import EnvConfig, EvalConfig
from spice_ray.evaluate.online import applicable_specs
from spice_ray.evaluate.rows import concat_rows, tidy_rows
from spice_ray.fusion import (
    needs_bootstrap,
)
from spice_ray.model.tokens import Tokens, make_tokens
from spice_ray.model.trunk import TrunkModel

OFFLINE_TIES_STREAM = "offline/ties"
"""TaskStreams stream of the offline picks' tie-breaking uniforms (one per task and h)."""

log = logging.getLogger(__name__)


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
        "prior_std", and "pred_var" with a variance head); "latent" [B, T+1, D] and
        "prior_mean_all" [B, T+1, A] when asked.
    """
    model.eval()
    device = model.trunk.embed.weight.device
    pos = torch.as_tensor(np.asarray(positions, dtype=np.int64))
    parts: dict[str, list[Tensor]] = {}
    for lo in range(0, tokens.batch_size, batch_size):
        chunk = _slice_tokens(tokens, slice(lo, lo + batch_size)).to(device)
        latent = model.trunk.encode(chunk)  # (b, T+1, D)
        head = model.heads(latent[:, pos.to(device)])  # fields (b, P, ...)
        got = {name: getattr(head, name)
               for name in ("logits", "prior_mean", "prior_std", "pred_var")
               if getattr(head, name, None) is not None}
        if keep_latents:
            got["latent"] = latent
        if keep_prior_means:
            got["prior_mean_all"] = model.heads(latent).prior_mean  # (b, T+1, A)
        for name, value in got.items():
            parts.setdefault(name, []).append(value.cpu())
    return {name: torch.cat(values) for name, values in parts.items()}



# ---- offline rows --------------------------------------------------------------


def offline_rows(
    env_cfg: EnvConfig,
    eval_cfg: EvalConfig,
    data: Mapping[str, np.ndarray],
    specs: Sequence[AgentSpec],
    model: TrunkModel | None = None,
    seed: int = 0,
    hs: np.ndarray | None = None,
    batch_size: int = 32,
) -> pd.DataFrame:
    """Offline suboptimality vs context length h (metric "suboptimality", x = h) in a stateless
    environment: max_a v_a - v_{a_hat}, v the environment's action values.

    Args:
        env_cfg: the environment config (A; sigma for TS and the rows).
        eval_cfg: offline_points and the baseline constants.
        data: eval-split columns of B tasks: task_id, actions, rewards and the environment's.
        specs: agents; those without an offline rule (ucb, optimal) are skipped, and SPICE
            specs that differ only in online settings share one curve.
        model: the checkpoint for spice / dpt / ad-bc specs.
        seed: the checkpoint's training seed (the rows' ``seed``).
        hs: context lengths (default :func:`offline_context_lengths`).
        batch_size: tasks per model forward.
    """
    env = env_cfg.environment()
    if "offline" not in env.protocols:
        raise ValueError(f"env.name={env.name} has no offline protocol")
    A = env.num_actions
    actions = torch.as_tensor(np.asarray(data["actions"], dtype=np.int64))  # (B, T)
    rewards = torch.as_tensor(np.asarray(data["rewards"], dtype=np.float64))  # (B, T)
    values = env.action_values(env.eval_tasks(data))  # (B, A)
    sigma = float(env.params.sigma)
    task_ids = np.asarray(data["task_id"])
    T = actions.shape[1]
    hs = offline_context_lengths(T, eval_cfg.offline_points) if hs is None else np.asarray(hs)
    if hs.min() < 0 or hs.max() > T:
        raise ValueError(f"context lengths must lie in [0, {T}]")
    # Ties (a flat prior before any data, arms never seen) are broken by a uniform per (eval
    # seed, task, h), the same for every agent: results do not depend on the sharding.
    ties = torch.as_tensor(TaskStreams.from_seed(eval_cfg.seed, "eval", task_ids).uniform(
        OFFLINE_TIES_STREAM, (T + 1,))[:, hs])  # (B, P)
    todo = applicable_specs(specs, env, eval_cfg, online=False)
    outputs: dict[str, Tensor] | None = None
    model_specs = [s for s in todo if s.uses_model]
    if model_specs:
        if model is None:
            raise ValueError(f"{model_specs[0].method} needs a model")
        tokens = make_tokens(data, env)
        spice = [s for s in model_specs if s.info.fused]
        outputs = sequence_outputs(model, tokens, hs,
                                   keep_prior_means=any(needs_bootstrap(s.fusion) for s in spice),
                                   batch_size=batch_size)
    contexts = OfflineContexts(actions, rewards, hs, A, ties, outputs, env.state_dim)
    frames = []
    for spec in todo:  # each method makes its own picks (agents.OfflinePicker)
        agent = make_agent(spec, env, model=model if spec.uses_model else None,
                           eval_cfg=eval_cfg, sigma=sigma)
        if not isinstance(agent, OfflinePicker):
            raise ValueError(f"method {spec.method!r} says it has an offline protocol but its "
                             "agent has no offline_picks")
        picks = agent.offline_picks(contexts)  # (B, P)
        pick_values = np.take_along_axis(values, picks.numpy().astype(np.int64), axis=1)
        subopt = values.max(axis=1, keepdims=True) - pick_values  # (B, P)
        frames.append(tidy_rows(env.name, spec.label, spec.rule(online=False),
                                spec.config_json(eval_cfg, online=False, sigma=sigma),
                                seed, task_ids, SUBOPTIMALITY, hs, subopt))
    return concat_rows(frames)


