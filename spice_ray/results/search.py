"""How a goal-reaching episode went: whether and when the agent first reached the goal, and
whether it stayed there, from the cumulative-return curve an online table already holds.

A darkroom's reward is positive exactly on the goal (1 in the grid families; the continuous
Darkroom's smooth reward is not, so these statistics do not apply to it), so the step
rewards, the differences of ``cumulative_return`` over consecutive steps, say where the agent
was: its first positive reward is its first arrival, and the share of positive rewards after
it is how much of the rest of the episode it spent on the goal. That decomposes a final regret
into search (reaching the goal at all, and how soon) and exploitation (staying once found),
per method, without another rollout.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from spice_ray.common.metrics import CUMULATIVE_RETURN

GROUP = ("method", "variant", "rule", "config")
"""What one row of :func:`search_stats` is: a method at one setting."""


def step_rewards(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (method at a setting, seed, task): the reward of every step, float [T] columns
    1..T, from the ``cumulative_return`` rows of an online table.

    Raises:
        ValueError: no ``cumulative_return`` rows, or an episode whose steps are not every
            step 1..T (a table that kept only some points of the curve).
    """
    ret = rows[rows["metric"] == CUMULATIVE_RETURN]
    if ret.empty:
        raise ValueError(f"the rows have no {CUMULATIVE_RETURN!r} metric: search statistics "
                         "need an online table's return curve")
    keys = [c for c in (*GROUP, "seed", "task_id") if c in ret.columns]
    wide = ret.pivot_table(index=keys, columns="x", values="value", aggfunc="first",
                           observed=True)
    steps = wide.columns.to_numpy()
    if wide.isna().to_numpy().any() or not np.array_equal(steps, np.arange(1, len(steps) + 1)):
        raise ValueError("search statistics need the return at every step 1..T of every "
                         f"episode; the table has steps {steps[:5].tolist()}... "
                         f"({len(steps)} in all)")
    values = wide.to_numpy(dtype=np.float64)
    rewards = np.diff(values, axis=1, prepend=0.0)
    return pd.DataFrame(rewards, index=wide.index, columns=steps)


def search_stats(rows: pd.DataFrame) -> pd.DataFrame:
    """Per method at a setting (:data:`GROUP`): ``episodes`` (seed x task), ``reached`` (the
    share that reached the goal within the horizon), ``first_arrival`` (the median step of the
    first arrival among those that did), ``on_goal_after`` (the share of the steps after the
    first arrival spent on the goal, pooled over those episodes; NaN where none arrived before
    the last step), sorted by method."""
    rewards = step_rewards(rows)
    r = rewards.to_numpy() > 0  # (E, T): on the goal at that step
    T = r.shape[1]
    reached = r.any(1)
    first = np.where(reached, r.argmax(1) + 1, 0)  # 1-based step of the first arrival
    after = np.where(reached, T - first, 0)  # steps after it
    on_after = np.where(reached, r.sum(1) - 1, 0)
    by = [c for c in GROUP if c in rewards.index.names]
    frame = pd.DataFrame({"reached": reached, "first": np.where(reached, first, np.nan),
                          "after": after, "on_after": on_after},
                         index=rewards.index).reset_index()
    out = frame.groupby(by, observed=True, dropna=False).agg(
        episodes=("reached", "size"), reached=("reached", "mean"),
        first_arrival=("first", "median"), on_after=("on_after", "sum"),
        after=("after", "sum")).reset_index()
    out["on_goal_after"] = (out["on_after"] / out["after"].where(out["after"] > 0))
    return out.drop(columns=["on_after", "after"]).sort_values(by, ignore_index=True)
