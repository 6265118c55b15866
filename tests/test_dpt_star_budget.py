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
    chosen = choose_budget(table)
    assert (chosen["epoch"], chosen["steps"], chosen["mean"]) == (3, 300, 30)


def test_a_checkpoint_missing_a_seed_is_refused_by_name() -> None:
    rows = _returns({1: [[1, 2], [3, 4]], 2: [[5, 6]]})
    with pytest.raises(ValueError, match="steps 200 lack a seed"):
        budget_table(rows)


def test_a_checkpoint_is_found_by_the_epochs_it_trained_not_its_place(tmp_path,
                                                                       monkeypatch) -> None:
    """A training that checkpoints every 2 epochs keeps epoch-0001, epoch-0003, ...: the
    checkpoint after 4 epochs is epoch-0003 (its own meta.json says so), not the list's
    fourth; one after 3 epochs does not exist and is refused, naming those there are."""
    import torch

    from spice_ray.config import make_config
    from spice_ray.model.checkpoint import save_checkpoint
    from spice_ray.model.registry import build_model
    from spice_ray.study import run_models

    cfg = make_config("smoke", "darkroom")
    model = build_model("dpt", cfg, torch.Generator().manual_seed(0))
    dirs = []
    for epoch in (1, 3, 5, 7):  # 0-based, as the loop writes them
        dirs.append(tmp_path / f"epoch-{epoch:04d}")
        save_checkpoint(dirs[-1], model, cfg, "hash", epoch)
    monkeypatch.setattr(run_models, "epoch_checkpoints", lambda *a, **k: dirs)
    assert run_models.checkpoint_after("RUN", "darkroom_dpt_star", 0, 4, kind="dpt") == dirs[1]
    assert [run_models.trained_epochs(d) for d in dirs] == [2, 4, 6, 8]
    with pytest.raises(ValueError, match="darkroom_dpt_star dpt seed 0 has no checkpoint after "
                                         "3 epochs; it has them after 2, 4, 6, 8"):
        run_models.checkpoint_after("RUN", "darkroom_dpt_star", 0, 3, kind="dpt")
