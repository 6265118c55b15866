"""Baselines: classical bandit algorithms built on ``spice_ray.fusion``."""

from spice_ray.baselines.bandits import (
    LCB,
    OFFLINE_BASELINES,
    ONLINE_BASELINES,
    UCB,
    BanditController,
    CountingBandit,
    EmpiricalMean,
    OfflinePicker,
    PosteriorBandit,
    ThompsonSampling,
    cumulative_regret,
    instant_regret,
    make_baseline,
    offline_suboptimality,
    run_online_bandit,
)

__all__ = [
    "LCB",
    "OFFLINE_BASELINES",
    "ONLINE_BASELINES",
    "UCB",
    "BanditController",
    "CountingBandit",
    "EmpiricalMean",
    "OfflinePicker",
    "PosteriorBandit",
    "ThompsonSampling",
    "cumulative_regret",
    "instant_regret",
    "make_baseline",
    "offline_suboptimality",
    "run_online_bandit",
]
