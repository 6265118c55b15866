"""Evaluate agents in this process, with no Ray and no run directory: the quickest way to try
a new agent against the platform's references on the study's own tasks.

    from spice_ray.evaluate import evaluate
    rows = evaluate(["ucb", "ts", "random"], env="bandit", num_tasks=64)  # or your own spec
    rows[rows.metric == "cumulative_regret"].groupby("method")["value"].mean()

The rows are the study's (``spice_ray.results.schema``): the same online loop, keyed noise and
tie draws as its evaluation stage, so a method scores here what it scores in a study.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from spice_ray.agents import AgentSpec
from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.evaluate.online import online_rows
from spice_ray.model.trunk import TrunkModel


def evaluate(agents: Sequence[AgentSpec | str], env: str = "bandit", preset: str = "smoke",
             split: str = "eval", num_tasks: int = 64, overrides: Sequence[str] = (),
             model: TrunkModel | None = None) -> pd.DataFrame:
    """Online rows of ``agents`` on the first ``num_tasks`` tasks of ``split``.

    Args:
        agents: specs, or method names (a registered method at its defaults).
        env: a registered environment; ``preset`` and ``overrides`` (``--set`` strings, e.g.
            ``"eval.online_horizon=200"``) give its config as the study's.
        split: "train", "validation" or "eval" (tune on validation, report on eval).
        model: the trained model that learned methods (SPICE, DPT) read.

    Raises:
        ConfigError: a bad override; ValueError: an unknown method or split.
    """
    if num_tasks < 1:
        raise ValueError(f"num_tasks={num_tasks!r} is invalid: an integer >= 1")
    cfg = make_config(preset, env, overrides=list(overrides))
    specs = [a if isinstance(a, AgentSpec) else AgentSpec(a) for a in agents]
    for spec in specs:
        spec.info  # noqa: B018 -- an unknown method fails here, naming it
    data = generate_tasks(cfg.env, cfg.data, split, np.arange(num_tasks))
    return online_rows(cfg.env, cfg.eval, data, specs, model=model)
