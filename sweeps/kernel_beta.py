"""Sweep the SPICE fusion kernel, its RBF bandwidth tau, and the posterior-UCB beta (fixed
values or the sqrt(2 log t) schedule) on bandits and Darkroom, with Ray Tune.

    python sweeps/kernel_beta.py --preset small                  # both envs, under ~15 min
    python sweeps/kernel_beta.py --preset smoke --out /tmp/sweep_smoke
    python sweeps/kernel_beta.py --preset paper --env darkroom --address auto
    python sweeps/kernel_beta.py --preset small --set sweep.max_concurrent_trials=2

The dataset and the SPICE checkpoints of every seed are made first (both skipped when current,
so this shares them with pipelines/ when --out is the same). Each Tune trial evaluates one
fusion config online on the validation tasks (``sweep.split``); tables go to
<out>/sweeps/kernel_beta_<env>.parquet and <out>/sweeps/kernel_beta_<env>_summary.parquet.
A re-run restores the Tune experiment and runs only the trials that did not finish (--fresh
starts again).

Grid: tau only matters for the RBF kernel and the sqrt2logt schedule ignores beta, so the grid
is (uniform, cosine, rbf x TAUS) x (fixed x BETAS, sqrt2logt) rather than the full product;
the redundant combinations would repeat identical runs. A bandit has one state, where every
kernel weighs every transition alike: its grid is beta and the schedule only. TAUS and BETAS
per preset are ``GRIDS["tau"]`` and ``GRIDS["beta"]`` of spice_ray/config/grids.py: smoke 3 x 2
= 6 trials (bandit 2), small 4 x 3 = 12 (bandit 3), paper 7 x 6 = 42 (bandit 6).

`small` is cut down so that both envs finish in ~15 min on 2 cores (about 5-25 s per trial).

Search instead of enumerate: ``--set sweep.search=optuna`` (Optuna's TPE through Tune, seeded by
sweep.seed) or ``random`` (Optuna's uniform sampler) samples kernel, tau, beta and schedule from
ranges (:func:`search_space`), ``sweep.num_samples`` trials at most: tau only for the RBF and beta
only for the fixed schedule, and a configuration drawn twice runs once (the search ends early
when it finds nothing new); ``--set sweep.scheduler=asha`` lets
Tune's ASHA stop trials whose running regret after a chunk of the tasks is poor:

    python sweeps/kernel_beta.py --env darkroom --set sweep.search=optuna \
        --set sweep.scheduler=asha --set sweep.num_samples=16
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from spice_ray import sweep
from spice_ray.config.grids import GRIDS as HYPER
from spice_ray.sweep.params import Conditional

if TYPE_CHECKING:  # annotations only: --help answers before torch loads
    from spice_ray.config import ExperimentConfig, FusionConfig

KERNELS = ("uniform", "cosine", "rbf")
GRIDS: dict[str, dict[str, tuple[float, ...]]] = {
    preset: {"taus": taus, "betas": HYPER["beta"].sweep[preset]}
    for preset, taus in HYPER["tau"].sweep.items()}
"""Per preset (``medium`` inherits ``small``'s), from ``spice_ray.config.grids``."""


def fusion_grid(base: FusionConfig, taus: tuple[float, ...], betas: tuple[float, ...],
                stateless: bool = False) -> list[dict[str, Any]]:
    """Every (kernel, tau, beta, schedule) to try, without combinations that repeat a run.

    Non-RBF kernels keep the base tau and the sqrt2logt schedule keeps the base beta (both
    unused there), so every trial carries all four fields. A stateless environment keeps the
    base kernel (every kernel gives every transition the same weight there). The beta points
    are the tuning grid's crossing (``agents.tunables.beta_points``) over this sweep's values.
    """
    from spice_ray.agents.tunables import beta_points
    from spice_ray.fusion import BANDWIDTH_KERNELS

    kernels = ([{"kernel": base.kernel, "tau": base.tau}] if stateless else
               [{"kernel": k, "tau": float(t)} for k in KERNELS
                for t in (taus if k in BANDWIDTH_KERNELS else (base.tau,))])
    schedules = [{**p.fields, "beta": float(p.fields.get("beta", base.beta))}
                 for p in beta_points(tuple(float(b) for b in betas))]
    return [k | s for k in kernels for s in schedules]


def search_space(base: FusionConfig, preset: str, search: str = "grid",
                 stateless: bool = False) -> dict[str, Any]:
    """The Tune param_space: one grid over the fusion overrides of :func:`fusion_grid`, or
    (``sweep.search`` random or optuna) a conditional space over the same ranges: the kernel,
    log-uniform tau for a kernel that reads it, the beta schedule, and log-uniform beta for a
    schedule that reads it (ranges: ``Grid.search``; the others keep the base value, unused)."""
    from ray import tune

    from spice_ray.fusion import BANDWIDTH_KERNELS, BETA_FREE_SCHEDULES

    if search == "grid":
        return {"fusion": tune.grid_search(fusion_grid(base, **sweep.preset_grid(GRIDS, preset),
                                                       stateless=stateless))}
    kernel = ({"kernel": base.kernel, "tau": base.tau} if stateless else
              {"kernel": tune.choice(list(KERNELS)),
               "tau": Conditional(tune.loguniform(*HYPER["tau"].search),
                                  when={"fusion.kernel": tuple(sorted(BANDWIDTH_KERNELS))},
                                  otherwise=base.tau)})
    schedules = ("fixed", "sqrt2logt")
    return {"fusion": {**kernel, "beta_schedule": tune.choice(list(schedules)),
                       "beta": Conditional(tune.loguniform(*HYPER["beta"].search),
                                           when={"fusion.beta_schedule": tuple(
                                               s for s in schedules
                                               if s not in BETA_FREE_SCHEDULES)},
                                           otherwise=base.beta)}}


def space_of(cfg: ExperimentConfig) -> dict[str, Any]:
    """:func:`search_space` for a validated config (its environment, preset and search)."""
    return search_space(cfg.fusion, cfg.preset, cfg.sweep.search,
                        stateless=cfg.environment().stateless)


if __name__ == "__main__":
    sweep.main("kernel_beta", space_of, __doc__, both=("bandit", "darkroom"))
