"""Does a darkroom family's learned prior read the goal from its context? Q-bar against the
task's optimal values, at context lengths h, split by whether the context has shown the goal.

A grid darkroom task is known exactly once its goal is: the optimal values follow from the
goal alone (:func:`goal_values`, value iteration on the grid: gamma^d / (1 - gamma) for the
reward of 1 on the goal, the smooth reward's own values on the continuous Darkroom), and the
exact posterior over the goal given a context (:func:`goal_weights`) only rules cells in or out
(a reward is a deterministic function of the cell and the goal). So at every checkpoint one can
say whether the value heads read the context, with no labels and no rollout.

What the model is asked is what the online agent asks: after h transitions of a walk the agent
stands in the walk's state s_h; its query token holds s_h and the prior is the heads' output at
position h (:func:`learned_readout`). Per (task, h) that is one state, compared with

- Q*: the task's optimal values at s_h (the truth);
- the exact posterior's mean values at s_h given the same h transitions (``bayes``: the best a
  prior could do with that context);
- the family's goal distribution's mean values at s_h (``blind``: a prior that knows where
  goals tend to be and reads nothing of the context, the context-free reference).

:func:`readout_rows` gives, per h and context group (all, goal shown, goal not shown), the share
of states where argmax Q-bar is an optimal action (the analogue of DPT*'s per-action accuracy),
the RMSE against Q*, and per width source the 90% coverage of Q* and the mean pseudo-count
N_pri = sigma^2 / max(sd^2, v_min). Pure numpy and torch: no Ray, no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
import torch

from spice_ray.config import EnvConfig, FusionConfig
from spice_ray.envs.darkroom import MOVES, all_cells, move
from spice_ray.evaluate.calibration import prior_pseudocounts
from spice_ray.evaluate.offline import sequence_outputs
from spice_ray.evaluate.online import cell_index
from spice_ray.fusion.width import WIDTH_FIELDS, learned_prior_std
from spice_ray.model.tokens import make_tokens
from spice_ray.model.trunk import TrunkModel

READOUT_LENGTHS = (0, 10, 25, 50, 100)
"""Context lengths h of the read-out. A length at or past the horizon T is read at T - 1:
position T follows the last transition, so no target ever trained its values (transition t's
value comes from position t - 1) and the agent never acts from it."""
GROUPS = ("all", "goal shown", "goal not shown")
"""The context groups of :func:`readout_rows`: shown = the walk has arrived on the goal."""
REWARD_TOL = 1e-5
"""A reward 'matches' a goal within this (the continuous Darkroom stores float32 rewards)."""
Z90 = NormalDist().inv_cdf(0.95)


def next_cells(size: int) -> np.ndarray:
    """The cell index (x-major) each action leads to from each cell, int64 [S, A]."""
    nxt = move(all_cells(size)[:, None, :], np.arange(len(MOVES))[None, :], size)  # (S, A, 2)
    return cell_index(nxt, size)


def goal_values(arrival_rewards: np.ndarray, size: int, gamma: float, tol: float = 1e-12
                ) -> np.ndarray:
    """Optimal Q*_g(s, a) for every goal g, cell s and action a, by value iteration.

    Args:
        arrival_rewards: float [G, S], the reward of arriving in cell s when the goal is g.
        size: grid side (S = size^2 cells, x-major).
        gamma: discount in [0, 1).
        tol: stop when no value moves by more than this.

    Returns:
        float64 [G, S, A]: Q*_g(s, a) = R_g(s') + gamma max_a' Q*_g(s', a'), s' = move(s, a).
    """
    if not 0 <= gamma < 1:
        raise ValueError(f"gamma={gamma!r} is invalid: in [0, 1)")
    rewards = np.asarray(arrival_rewards, dtype=np.float64)
    nxt = next_cells(size)  # (S, A)
    r = rewards[:, nxt]  # (G, S, A)
    value = np.zeros(rewards.shape)  # (G, S)
    while True:
        q = r + gamma * value[:, nxt]  # (G, S, A)
        new = q.max(-1)
        if np.abs(new - value).max(initial=0.0) <= tol:
            return q
        value = new


def optimal_set(q: np.ndarray, rtol: float = 1e-9) -> np.ndarray:
    """bool [..., A]: the actions whose value is the maximum (ties kept) of q [..., A]."""
    top = q.max(-1, keepdims=True)
    return q >= top - rtol * np.maximum(np.abs(top), 1.0)


def goal_weights(prior: np.ndarray, arrival_rewards: np.ndarray, cells_after: np.ndarray,
                 rewards: np.ndarray, hs: np.ndarray) -> np.ndarray:
    """The exact posterior over the goal after the first h transitions of each context.

    A goal stays possible while every reward seen equals the reward it gives on arriving in
    that cell; the posterior is the prior restricted to the possible goals.

    Args:
        prior: [G] the family's goal distribution over cells.
        arrival_rewards: [G, S] as :func:`goal_values`.
        cells_after: int [B, T] the cell index each transition arrived in.
        rewards: [B, T] the rewards seen.
        hs: int [P] context lengths in [0, T].

    Returns:
        float64 [B, P, G], rows summing to 1.

    Raises:
        ValueError: a context that no goal explains (rewards from another family).
    """
    seen = np.asarray(arrival_rewards, dtype=np.float64)[:, cells_after]  # (G, B, T)
    wrong = np.abs(seen - np.asarray(rewards, dtype=np.float64)[None]) > REWARD_TOL
    ruled_out = np.concatenate([np.zeros_like(wrong[..., :1]), np.cumsum(wrong, -1) > 0],
                               -1)  # (G, B, T+1): ruled out after t transitions
    weights = np.asarray(prior, np.float64)[None, None, :] * ~ruled_out[:, :, hs].transpose(
        1, 2, 0)  # (B, P, G)
    total = weights.sum(-1, keepdims=True)
    if (total <= 0).any():
        b = int(np.argwhere(total[..., 0] <= 0)[0, 0])
        raise ValueError(f"context {b} has rewards that no goal of the family gives")
    return weights / total


@dataclass(frozen=True)
class Readout:
    """Per task b and context length hs[p]: the state the agent stands in and its values.

    Attributes:
        hs: int [P].
        q_star: float64 [B, P, A] the task's optimal values at that state.
        bayes: float64 [B, P, A] the exact posterior's mean values given the context.
        blind: float64 [B, P, A] the family's goal distribution's mean values (no context).
        shown: bool [B, P] whether the first h transitions arrived on the goal.
        arrival: int [B] the index s_t of the walk's first state on the goal (-1: never).
        goal_q_star: float64 [B, A] the task's optimal values on its goal cell (stay, and the
            moves into a wall, are optimal there).
    """

    hs: np.ndarray
    q_star: np.ndarray
    bayes: np.ndarray
    blind: np.ndarray
    shown: np.ndarray
    arrival: np.ndarray | None = None
    goal_q_star: np.ndarray | None = None


def exact_readout(family: Mapping[str, Any], goals: np.ndarray, cells: np.ndarray,
                  rewards: np.ndarray, hs: np.ndarray, gamma: float) -> Readout:
    """The exact side of the read-out for walks.

    Args:
        family: ``size``, ``goal_prior`` [G] and ``arrival_rewards`` [G, S] (an environment's
            :meth:`goal_family`).
        goals: int [B, 2] each task's goal cell.
        cells: int [B, T+1, 2] each walk's cells s_0..s_T.
        rewards: [B, T].
        hs: int [P] in [0, T].
        gamma: the value heads' discount.
    """
    size = int(family["size"])
    hs = np.asarray(hs, dtype=np.int64)
    values = goal_values(family["arrival_rewards"], size, gamma)  # (G, S, A)
    index = cell_index(np.asarray(cells, np.int64), size)  # (B, T+1)
    goal = cell_index(np.asarray(goals, np.int64), size)  # (B,)
    here = index[:, hs]  # (B, P)
    weights = goal_weights(family["goal_prior"], family["arrival_rewards"], index[:, 1:],
                           rewards, hs)  # (B, P, G)
    at = values[:, here]  # (G, B, P, A)
    on_goal = index[:, 1:] == goal[:, None]  # (B, T): transition t arrived on the goal
    arrived = np.concatenate([np.zeros_like(index[:, :1], dtype=bool),
                              np.cumsum(on_goal, 1) > 0], 1)
    return Readout(
        hs=hs,
        q_star=values[goal[:, None], here],  # (B, P, A)
        bayes=np.einsum("bpg,gbpa->bpa", weights, at),
        blind=np.einsum("g,gbpa->bpa", np.asarray(family["goal_prior"], np.float64), at),
        shown=arrived[:, hs],
        arrival=np.where(on_goal.any(1), on_goal.argmax(1) + 1, -1),
        goal_q_star=values[goal, goal],  # (B, A)
    )


def learned_readout(model: TrunkModel, env_cfg: EnvConfig, data: Mapping[str, np.ndarray],
                    hs: np.ndarray, batch_size: int = 64) -> dict[str, np.ndarray]:
    """The model's heads where the online agent reads them: for each h, the query token holds
    the walk's state after h transitions and the heads are read at position h.

    Args:
        data: split columns of a walk roll-in (``states`` [B, T+1, ...] and the rest).

    Returns:
        float64 [B, P, A] per head field: ``prior_mean``, ``prior_std`` and, with a variance
        head, ``pred_var``.
    """
    env = env_cfg.environment()
    states = np.asarray(data["states"])
    if states.shape[1] != np.asarray(data["actions"]).shape[1] + 1:
        raise ValueError(f"the read-out needs walk contexts (states [B, T+1]); "
                         f"{env_cfg.name}'s have states {states.shape}: set env.rollin=walk")
    parts: dict[str, list[np.ndarray]] = {}
    for h in np.asarray(hs, dtype=np.int64):
        asked = {**data, "query_state": states[:, h]}  # where the agent stands after h steps
        out = sequence_outputs(model, make_tokens(asked, env), np.array([h]),
                               batch_size=batch_size)
        if "prior_std" not in out:
            raise ValueError("the prior read-out needs a SpiceModel (a value ensemble)")
        for name in ("prior_mean", "prior_std", "pred_var"):
            if name in out:
                parts.setdefault(name, []).append(out[name].to(torch.float64).numpy())
    return {name: np.concatenate(values, axis=1) for name, values in parts.items()}


def arrival_readout(model: TrunkModel, env_cfg: EnvConfig, data: Mapping[str, np.ndarray],
                    arrival: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Q-bar where each walk first arrives on its goal, read as the online agent that has just
    arrived reads it: position h = ``arrival`` (its context ends with the arrival), the query
    token holding the goal cell. float64 [B, A]; NaN rows for walks that never arrive, or
    arrive only with their last transition (position T is never acted from).

    Args:
        arrival: int [B] the index of the walk's first state on the goal (:class:`Readout`).
    """
    env = env_cfg.environment()
    states = np.asarray(data["states"])
    T = np.asarray(data["actions"]).shape[1]
    first = np.asarray(arrival, dtype=np.int64)
    usable = (first >= 0) & (first <= T - 1)
    out = np.full((len(states), env.num_actions), np.nan)
    if not usable.any():
        return out
    positions = np.unique(first[usable])
    asked = {**data, "query_state": states[np.arange(len(states)), np.where(usable, first, 0)]}
    read = sequence_outputs(model, make_tokens(asked, env), positions, batch_size=batch_size)
    mean = read["prior_mean"].to(torch.float64).numpy()  # (B, P, A)
    rows = np.flatnonzero(usable)
    out[rows] = mean[rows, np.searchsorted(positions, first[rows])]
    return out


def width_sources(fusion: FusionConfig, learned: Mapping[str, np.ndarray], hs: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """The prior's sd [B, P, A] under each width source the model has: the ensemble's
    sigma_Q as the paper reads it (``ensemble``), the run's own setting (``fusion``: its scale
    and decay) where it differs, and the predictive-variance head's (``predictive``)."""
    std = torch.from_numpy(learned["prior_std"])
    h = torch.as_tensor(np.asarray(hs))[None, :, None]
    pred_var = torch.from_numpy(learned["pred_var"]) if "pred_var" in learned else None
    paper = dataclasses.replace(fusion, **WIDTH_FIELDS)
    out = {"ensemble": learned_prior_std(paper, std, h).to(torch.float64).numpy()}
    scaled = fusion.width_scale != paper.width_scale or fusion.width_decay != paper.width_decay
    if fusion.width_source == paper.width_source and scaled:
        out["fusion"] = learned_prior_std(fusion, std, h).to(torch.float64).numpy()
    if pred_var is not None:
        predictive = dataclasses.replace(fusion, **WIDTH_FIELDS | {"width_source": "predictive"})
        out["predictive"] = learned_prior_std(predictive, std, h, pred_var).to(
            torch.float64).numpy()
    return out


def value_spread(learned: np.ndarray, star: np.ndarray) -> dict[str, float]:
    """The spread (sd) over states of the learned state values and of V*, and their
    correlation (NaN under 3 states or where either has no spread)."""
    nan = float("nan")
    if learned.size == 0:
        return {"v_sd_learned": nan, "v_sd_q_star": nan, "v_corr": nan}
    sd_l, sd_s = float(learned.std()), float(star.std())
    corr = (float(np.corrcoef(learned, star)[0, 1])
            if learned.size >= 3 and sd_l > 0 and sd_s > 0 else nan)
    return {"v_sd_learned": sd_l, "v_sd_q_star": sd_s, "v_corr": corr}


def readout_rows(prior_mean: np.ndarray, widths: Mapping[str, np.ndarray], exact: Readout,
                 noise_var: float, v_min: float, on_arrival: np.ndarray | None = None
                 ) -> pd.DataFrame:
    """One row per context length and group (:data:`GROUPS`): ``n`` states; the share of
    them where argmax of the learned prior (``optimal_share``), of the exact posterior
    (``optimal_share_bayes``) and of the context-free prior (``optimal_share_blind``) is an
    optimal action; the RMSE of each against Q* over states and actions; the mean of Q-bar and
    of Q* over states and actions (``mean_learned``, ``mean_q_star``: their scales); per width
    source W,
    ``coverage_90_W`` (share of state-actions with Q* inside Q-bar +- 1.645 sd) and
    ``n_pri_W`` (mean pseudo-count); and whether the values follow the states: the spread over
    the group's states of max_a Q-bar and of V* = max_a Q* (``v_sd_learned``, ``v_sd_q_star``)
    and their correlation (``v_corr``; NaN under 3 states or with no spread). A group with no
    state has n = 0 and NaN metrics. With ``on_arrival``, ``goal_cell_share``: of the contexts
    that have shown the goal by h, the share whose Q-bar at their first arrival picks an
    optimal action on the goal (stay, or a move into a wall): whether an agent that arrives
    stays (NaN where the group has none).

    Args:
        prior_mean: [B, P, A] the learned Q-bar (:func:`learned_readout`).
        widths: name -> sd [B, P, A] (:func:`width_sources`).
        exact: :func:`exact_readout` of the same contexts and lengths.
        on_arrival: [B, A] the learned Q-bar at each walk's first arrival on its goal
            (:func:`arrival_readout`; NaN rows where there is none).
    """
    best = optimal_set(exact.q_star)  # (B, P, A)

    def hit(mean: np.ndarray) -> np.ndarray:  # (B, P)
        return np.take_along_axis(best, mean.argmax(-1)[..., None], -1)[..., 0]

    def sq(mean: np.ndarray) -> np.ndarray:  # (B, P)
        return ((mean - exact.q_star) ** 2).mean(-1)

    per_state = {"optimal_share": hit(prior_mean), "optimal_share_bayes": hit(exact.bayes),
                 "optimal_share_blind": hit(exact.blind), "rmse": sq(prior_mean),
                 "rmse_bayes": sq(exact.bayes), "rmse_blind": sq(exact.blind),
                 "mean_learned": prior_mean.mean(-1), "mean_q_star": exact.q_star.mean(-1)}
    if on_arrival is not None:
        read = ~np.isnan(on_arrival).any(-1)  # (B,)
        stays = optimal_set(exact.goal_q_star)  # (B, A)
        picked = np.take_along_axis(stays, np.nan_to_num(on_arrival).argmax(-1)[:, None],
                                    -1)[:, 0]
        per_state["goal_cell_share"] = np.where(exact.shown & read[:, None],
                                                picked[:, None], np.nan)  # (B, P)
    for name, sd in widths.items():
        per_state[f"coverage_90_{name}"] = (np.abs(prior_mean - exact.q_star)
                                            <= Z90 * sd).mean(-1)
        per_state[f"n_pri_{name}"] = prior_pseudocounts(torch.from_numpy(sd), noise_var,
                                                        v_min).numpy().mean(-1)
    rows = []
    for p, h in enumerate(exact.hs):
        for group in GROUPS:
            mask = {"all": np.ones_like(exact.shown[:, p]), "goal shown": exact.shown[:, p],
                    "goal not shown": ~exact.shown[:, p]}[group]
            row: dict[str, Any] = {"h": int(h), "context": group, "n": int(mask.sum())}
            for name, values in per_state.items():
                v = values[:, p][mask]
                v = v[~np.isnan(v)] if name == "goal_cell_share" else v
                mean = float(v.mean()) if v.size else float("nan")
                row[name] = float(np.sqrt(mean)) if name.startswith("rmse") else mean
            row |= value_spread(prior_mean[:, p].max(-1)[mask], exact.q_star[:, p].max(-1)[mask])
            rows.append(row)
    return pd.DataFrame(rows)


def darkroom_prior_rows(model: TrunkModel, env_cfg: EnvConfig, data: Mapping[str, np.ndarray],
                        fusion: FusionConfig, gamma: float,
                        hs: tuple[int, ...] = READOUT_LENGTHS) -> pd.DataFrame:
    """:func:`readout_rows` of a SpiceModel on a darkroom family's walk contexts ``data`` at
    the lengths of ``hs`` within the horizon; ``gamma`` is the value heads' discount
    (``train.gamma``)."""
    env = env_cfg.environment()
    if not hasattr(env, "goal_family"):
        raise ValueError(f"env.name={env_cfg.name} has no goal family (a grid darkroom's "
                         "goals and rewards): the darkroom prior read-out does not apply")
    T = np.asarray(data["actions"]).shape[1]
    lengths = np.unique(np.minimum(np.asarray(hs, dtype=np.int64), T - 1))
    cells = env.positions(np.asarray(data["states"]))  # (B, T+1, 2)
    exact = exact_readout(env.goal_family(), data["goal"], cells, data["rewards"], lengths,
                          gamma)
    learned = learned_readout(model, env_cfg, data, lengths)
    return readout_rows(learned["prior_mean"], width_sources(fusion, learned, lengths), exact,
                        fusion.noise_var, fusion.v_min,
                        on_arrival=arrival_readout(model, env_cfg, data, exact.arrival))


SHOWN_FROM = 10
"""The read-out's shares are pooled over positions h >= this (at h = 0 nothing is shown): the
label-free number a step budget is chosen by, and what the read-out figure draws."""
CONTEXTS = ("goal shown", "goal not shown")
SHARES = ("optimal_share", "optimal_share_bayes", "optimal_share_blind")


def _pooled_readings(rows: pd.DataFrame) -> pd.DataFrame:
    """The read-out rows a pooled number is made of: each (steps, seed, h, context) read once
    (its first reading), the two context groups, positions h >= :data:`SHOWN_FROM`, and rows
    with states."""
    rows = rows.drop_duplicates(["steps", "seed", "h", "context"], keep="first")
    return rows[rows["context"].isin(CONTEXTS) & (rows["h"] >= SHOWN_FROM) & (rows["n"] > 0)]


def pooled_shares(rows: pd.DataFrame) -> pd.DataFrame:
    """Read-out rows (:func:`darkroom_prior_rows` with ``steps`` and ``seed``) pooled per
    (context, steps, seed), and over seeds (seed = -1): each share of :data:`SHARES` weighted
    by its row's state count, over h >= :data:`SHOWN_FROM`; a (steps, seed) read twice keeps
    its first reading."""
    use = _pooled_readings(rows)
    hits = use[["context", "steps", "seed", "n"]].assign(
        **{s: use[s] * use["n"] for s in SHARES})
    per_seed = hits.groupby(["context", "steps", "seed"], as_index=False)[[*SHARES, "n"]].sum()
    pooled = (per_seed.groupby(["context", "steps"], as_index=False)[[*SHARES, "n"]].sum()
              .assign(seed=-1))
    out = pd.concat([per_seed, pooled], ignore_index=True)
    for s in SHARES:
        out[s] = out[s] / out["n"]
    return out.sort_values(["context", "steps", "seed"], ignore_index=True)


def goal_cell_pooled(rows: pd.DataFrame) -> pd.Series:
    """Per ``steps``: ``goal_cell_share`` where the goal was shown, pooled over seeds and
    positions h >= :data:`SHOWN_FROM` by state count (NaN for read-outs without it)."""
    use = _pooled_readings(rows)
    use = use[use["context"] == "goal shown"]
    if "goal_cell_share" not in use:
        return pd.Series(float("nan"), index=sorted(rows["steps"].unique()), dtype=float)
    hits = (use["goal_cell_share"] * use["n"]).groupby(use["steps"]).sum()
    return hits / use.groupby("steps")["n"].sum()


VALUES = ("mean_learned", "mean_q_star", "v_sd_learned", "v_sd_q_star", "v_corr")
"""The read-out's columns on the values' scale and on whether they follow the states."""


def value_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Read-out rows pooled per (context, steps) over seeds and positions h >=
    :data:`SHOWN_FROM`, each of :data:`VALUES` weighted by its row's state count (a
    correlation over the rows that have one): the values' scale against Q*'s, and how much
    they spread over states and follow V*. Rows without the spread columns (read-outs
    written before them) give NaN there."""
    use = _pooled_readings(rows)
    out = []
    for (context, steps), g in use.groupby(["context", "steps"], sort=True):
        row: dict[str, Any] = {"context": context, "steps": steps, "n": int(g["n"].sum())}
        for name in VALUES:
            if name not in g:
                row[name] = float("nan")
                continue
            have = g.dropna(subset=[name])
            row[name] = (float((have[name] * have["n"]).sum() / have["n"].sum())
                         if len(have) else float("nan"))
        out.append(row)
    return pd.DataFrame(out, columns=["context", "steps", "n", *VALUES])
