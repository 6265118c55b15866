"""DPT*'s step budget chosen on validation returns (``tools/dpt_star_episode.py``): the rule
and its table on hand-made returns; the tool itself runs in the end-to-end study test."""

from __future__ import annotations

import pandas as pd
import pytest

from tools.dpt_star_episode import budget_table, choose_budget


def _returns(per_checkpoint: dict[int, list[list[float]]]) -> pd.DataFrame:
    """Rows (epoch, steps, seed, task, return) from {epoch: [[seed 0's task returns], ...]}."""
    return pd.DataFrame([{"epoch": e, "steps": 100 * e, "seed": s, "task": k, "return": r}
                         for e, seeds in per_checkpoint.items()
                         for s, tasks in enumerate(seeds) for k, r in enumerate(tasks)])


def test_the_budget_is_the_best_mean_over_seeds_and_the_shorter_on_a_tie() -> None:
    rows = _returns({1: [[10, 20], [30, 40]],   # seeds 15 and 35: mean 25
                     2: [[50, 50], [0, 10]],    # one seed's best is not the budget: 27.5
                     3: [[40, 40], [20, 20]],   # 30
                     4: [[30, 30], [30, 30]]})  # 30 again, later
    table = budget_table(rows)
    assert table["mean"].tolist() == [25, 27.5, 30, 30]
    assert table[["seed 0", "seed 1"]].iloc[1].tolist() == [50, 5]
    # the SEM is over the tasks' seed means: epoch 1's tasks average 20 and 30
    assert table["sem"].iloc[0] == pytest.approx(5.0)
    chosen = choose_budget(rows)
    assert (chosen["epoch"], chosen["steps"], chosen["mean"]) == (3, 300, 30)


def test_a_checkpoint_missing_a_seed_is_refused_by_name() -> None:
    rows = _returns({1: [[1, 2], [3, 4]], 2: [[5, 6]]})
    with pytest.raises(ValueError, match="steps 200 lack a seed"):
        choose_budget(rows)
