"""The application layer: the study and what it is made of, above the research code.

``experiment_spec`` and ``experiments`` (the study's experiments as data), ``records`` (what
the stages hand each other), ``tuning`` (every method's settings chosen on validation tasks),
``loss_weights`` (the loss weights chosen on validation), ``stages`` (the stage driver:
datasets, pretraining, tuning, evaluation), ``reporting`` (figures and the report over every
experiment of a run directory),
``dryrun`` (the plan without the work), ``run_models`` (a run's trained models and their
cards), ``ladder`` (the scaling experiment) and ``policy`` (a trained policy in your own
loop). ``plan_study``, ``run_study``, ``study_tables``, ``StudyPlan`` and
``evaluate_experiment`` are importable from here; they load the stages on first use, so that
importing one module of the layer (an experiment's declaration, say) does not start the
whole driver.
"""

from spice_ray.common.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {"stages": (
    "StudyPlan", "evaluate_experiment", "plan_study", "run_study", "study_tables")})
