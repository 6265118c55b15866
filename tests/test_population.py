"""Models trained as one population (``spice_ray.train.population``) against the same models
trained alone: same batches, same weights to rounding, same checkpoints, same resume."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from spice_ray.config import make_config
from spice_ray.data import store
from spice_ray.data.generate import generate_dataset
from spice_ray.model import checkpoint as ckpt
from spice_ray.model.registry import build_model, load_model, torch_threads
from spice_ray.model.tokens import Tokens
from spice_ray.train import population as pop_module
from spice_ray.train.loop import LocalContext, TrainingDiverged, fit
from spice_ray.train.population import (
    PopulationError,
    epoch_order,
    fit_population,
    functional_template,
)
from spice_ray.train.ray_train import plan_job, settle_final
from spice_ray.train.stream import shuffled_batches
from spice_ray.train.together import ModelSpec, pretrain_many

TOL = 1e-5
"""Largest weight difference allowed between a model trained in a population and alone after
two smoke epochs on the CPU (seen: 8e-7): batched products and the plain attention sum in
another order, nothing else differs."""


def _cfg(out: Path, *extra: str):
    return make_config("smoke", "darkroom", overrides=[
        "train.num_workers=0", "train.epochs=2", "train.checkpoint_every=1", f"out_dir={out}",
        *extra])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("population")
    return generate_dataset(_cfg(root), root / "ds").dataset_dir


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_model(path, kind=ckpt.read_meta(path)["kind"]).state_dict()


def _last(run_dir: Path) -> Path:
    return sorted((run_dir / "local").glob("epoch-*"))[-1]


def test_epoch_order_is_the_batches_shuffled_batches_makes() -> None:
    rng = np.random.default_rng(0)
    for sizes, batch, rows in (([7, 7, 5], 4, 19), ([10], 3, 10), ([4, 9, 2, 8], 5, 23)):
        chunks = []
        start = 0
        for n in sizes:
            chunks.append({"row": torch.arange(start, start + n)})
            start += n
        seed = int(rng.integers(1 << 30))
        got = [b["row"].numpy() for b in shuffled_batches(chunks, batch,
                                                          np.random.default_rng(seed), rows)]
        want = epoch_order(sizes, batch, np.random.default_rng(seed), rows)
        assert len(got) == rows // batch == len(want)
        assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_plain_attention_equals_sdpa() -> None:
    cfg = make_config("smoke", "darkroom")
    model = build_model("spice", cfg, torch.Generator().manual_seed(0)).eval()
    g = torch.Generator().manual_seed(1)
    B, T = 4, cfg.env.horizon
    tokens = Tokens(torch.randint(0, 5, (B, 2), generator=g).float(),
                    torch.randint(0, 5, (B, T, 2), generator=g).float(),
                    torch.randint(0, 5, (B, T), generator=g), torch.rand(B, T, generator=g),
                    torch.randint(0, 5, (B, T, 2), generator=g).float(),
                    torch.randint(0, 5, (B,), generator=g), torch.full((B, 5), 0.2))
    with torch.no_grad():
        fused = model(tokens)
        for mod in model.modules():
            if hasattr(mod, "plain"):
                mod.plain = True
        plain = model(tokens)
    assert torch.allclose(fused.logits, plain.logits, atol=1e-5)
    assert torch.allclose(fused.q, plain.q, atol=1e-5)


@pytest.mark.parametrize("kind", ["spice", "dpt"])
def test_population_equals_each_model_trained_alone(dataset, tmp_path, kind) -> None:
    planned = [plan_job(_cfg(tmp_path / "pop"), kind, s, dataset) for s in (0, 1)]
    result = fit_population([j for j, _ in planned], [d for _, d in planned])
    assert (result.start_epoch, result.last_epoch, result.stopped_early) == (0, 1, False)
    for m, seed in enumerate((0, 1)):
        job, run_dir = plan_job(_cfg(tmp_path / "alone"), kind, seed, dataset)
        metrics, model = fit(job, LocalContext(job, run_dir))
        together = _weights(_last(planned[m][1]))
        alone = model.state_dict()
        assert max(float((alone[k] - together[k]).abs().max()) for k in alone) < TOL
        assert result.metrics[m]["train_loss"] == pytest.approx(metrics["train_loss"], abs=1e-5)
        assert result.metrics[m]["val_loss"] == pytest.approx(metrics["val_loss"], abs=1e-5)
        meta = ckpt.read_meta(_last(planned[m][1]))
        assert meta["identity"] == job.identity() and meta["epoch"] == 1
        assert meta["seed"] == seed


def test_a_model_is_the_same_in_a_population_of_any_size_and_order(dataset, tmp_path) -> None:
    weights = []
    for name, seeds in (("one", (1,)), ("two", (0, 1)), ("swapped", (1, 0))):
        planned = [plan_job(_cfg(tmp_path / name, "train.epochs=1"), "spice", s, dataset)
                   for s in seeds]
        fit_population([j for j, _ in planned], [d for _, d in planned])
        weights.append(_weights(_last(planned[seeds.index(1)][1])))
    for other in weights[1:]:
        assert max(float((weights[0][k] - other[k]).abs().max()) for k in other) < TOL


def test_a_stopped_population_resumes_to_the_straight_run_bit_for_bit(dataset, tmp_path
                                                                       ) -> None:
    def run(out: Path, stop_after: float | None):
        planned = [plan_job(_cfg(out), "spice", s, dataset) for s in (0, 1)]
        return planned, fit_population([j for j, _ in planned], [d for _, d in planned],
                                       stop_after=stop_after)

    planned, first = run(tmp_path / "stopped", 0.0)
    assert first.stopped_early and first.last_epoch == 0
    assert [p.name for p in sorted((planned[0][1] / "local").glob("epoch-*"))] == ["epoch-0000"]
    _, resumed = run(tmp_path / "stopped", None)
    assert resumed.start_epoch == 1 and not resumed.stopped_early
    straight, _ = run(tmp_path / "straight", None)
    for (_, a), (_, b) in zip(planned, straight, strict=True):
        wa, wb = _weights(_last(a)), _weights(_last(b))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        # the study's pretraining takes a population's checkpoints as its own
        ckpt_dir = _last(a)
        assert ckpt.load_training_state(ckpt_dir)[2]["optimizer"]["state"]


def test_a_population_checkpoint_resumes_alone_and_settles_as_final(dataset, tmp_path) -> None:
    """The population writes the alone path's format: ``fit`` alone resumes from its epoch-0
    checkpoint, and the pretraining stage's ``settle_final`` accepts its last as final."""
    job, run_dir = plan_job(_cfg(tmp_path, "train.epochs=1"), "spice", 0, dataset)
    fit_population([job], [run_dir])
    longer, same_dir = plan_job(_cfg(tmp_path), "spice", 0, dataset)
    assert same_dir == run_dir  # a constant rate: the epochs are not in the identity
    metrics, _ = fit(longer, LocalContext(longer, run_dir))
    assert metrics["start_epoch"] == 1.0
    from spice_ray.train.loop import publish_final

    publish_final(_last(run_dir), run_dir / "final")
    assert settle_final(run_dir / "final", longer)


def test_models_that_differ_in_a_trained_setting_are_refused_by_name(dataset, tmp_path) -> None:
    a, da = plan_job(_cfg(tmp_path), "spice", 0, dataset)
    b, db = plan_job(_cfg(tmp_path, "train.lambda_q=0.5"), "spice", 1, dataset)
    with pytest.raises(PopulationError, match=r"train\.lambda_q is 0\.5"):
        fit_population([a, b], [da, db])
    c, dc = plan_job(_cfg(tmp_path), "dpt", 1, dataset)
    with pytest.raises(PopulationError, match="kind"):
        fit_population([a, c], [da, dc])


def test_a_diverging_model_is_named_with_its_step_and_leaves_no_checkpoint(
        dataset, tmp_path, monkeypatch) -> None:
    planned = [plan_job(_cfg(tmp_path), "spice", s, dataset) for s in (0, 1)]
    real = pop_module._clip_per_model

    def poisoned(grads_of, clip, loss, first_bad, step):
        if step == 3:  # model 1's loss turns NaN at its third step
            loss = loss.detach().clone()
            loss[1] = float("nan")
        return real(grads_of, clip, loss, first_bad, step)

    monkeypatch.setattr(pop_module, "_clip_per_model", poisoned)
    with pytest.raises(TrainingDiverged, match=r"spice seed 1 at step 3 \(epoch 1/2\)") as exc:
        fit_population([j for j, _ in planned], [d for _, d in planned])
    assert "seed 0" not in str(exc.value)
    assert not any((d / "local").exists() for _, d in planned)


def test_the_template_batches_what_vmap_cannot() -> None:
    template = functional_template("spice", make_config("smoke", "darkroom"))
    assert all(m.plain for m in template.modules() if hasattr(m, "plain"))
    assert template.m.ensemble.kernel == "eager"
    assert all(p.device.type == "meta" for p in template.parameters())


def _direct(dataset: Path, out: Path, kind: str, seeds: tuple[int, ...]) -> list[Path]:
    planned = [plan_job(_cfg(out), kind, s, dataset) for s in seeds]
    with torch_threads(1):
        fit_population([j for j, _ in planned], [d for _, d in planned])
    return [_last(d) for _, d in planned]


def _assert_equal_to_direct(finals: list[Path], dataset: Path, out: Path) -> None:
    """``finals`` of :func:`_specs`' models are bit for bit the populations trained directly."""
    want = _direct(dataset, out, "spice", (0, 1)) + _direct(dataset, out, "dpt", (0,))
    for got, ref in zip(finals, want, strict=True):
        a, b = _weights(got), _weights(ref)
        assert all(torch.equal(a[k], b[k]) for k in a)


def _specs(out: Path, *extra: str) -> list[ModelSpec]:
    cfg = _cfg(out, "train.population=true", *extra)
    return [ModelSpec(cfg, "spice", s, f"spice seed {s}") for s in (0, 1)] + [
        ModelSpec(cfg, "dpt", 0, "dpt seed 0")]


def test_populations_stepped_in_turn_equal_each_trained_alone(dataset, tmp_path) -> None:
    """``fit_populations`` (one process, a step of each population in turn, as the device
    script trains) gives each population's weights bit for bit."""
    from spice_ray.train.population import fit_populations

    groups = [[plan_job(_cfg(tmp_path / "turns"), kind, s, dataset) for s in seeds]
              for kind, seeds in (("spice", (0, 1)), ("dpt", (0,)))]
    with torch_threads(1):
        results = fit_populations([([j for j, _ in g], [d for _, d in g]) for g in groups])
    assert [(r.start_epoch, r.last_epoch) for r in results] == [(0, 1), (0, 1)]
    _assert_equal_to_direct([_last(d) for g in groups for _, d in g], dataset,
                            tmp_path / "direct")


def test_the_study_trains_populations_in_the_driver(dataset, tmp_path) -> None:
    """``train.population`` with ``num_workers=0``: the seeds of one kind train as one
    population in the driver, the same weights as the population trained directly; a re-run
    finds them current."""
    with torch_threads(1):
        finals, timing = pretrain_many(_specs(tmp_path / "study"), dataset)
    assert timing["worker"] == {"spice seed 0": 0, "spice seed 1": 0, "dpt seed 0": 0}
    _assert_equal_to_direct(finals, dataset, tmp_path / "direct")
    _, again = pretrain_many(_specs(tmp_path / "study"), dataset)
    assert again["jobs"] == 0


@pytest.mark.ray
def test_a_ray_train_worker_trains_whole_populations(ray_local, dataset, tmp_path) -> None:
    """With Ray Train workers each worker trains whole populations on one thread: the same
    weights as the population trained directly on one thread."""
    finals, timing = pretrain_many(_specs(tmp_path / "ray", "train.num_workers=2",
                                          "train.threads=1", "train.worker_cpus=0.5"), dataset)
    assert timing["jobs"] == 1
    assert timing["worker"] == {"spice seed 0": 0, "spice seed 1": 0, "dpt seed 0": 1}
    _assert_equal_to_direct(finals, dataset, tmp_path / "direct")


def test_a_captured_step_is_refused_with_a_cosine_rate_and_is_eager_on_a_cpu(dataset, tmp_path
                                                                          ) -> None:
    """A CUDA graph keeps the learning rate it was captured with, so ``graph=True`` refuses a
    cosine schedule by its field; on a CPU there is nothing to capture and ``graph=True``
    trains the eager path's weights bit for bit."""
    job, run_dir = plan_job(_cfg(tmp_path / "cos", "train.cosine_schedule=true"), "dpt", 0,
                            dataset)
    with pytest.raises(PopulationError, match=r"train\.cosine_schedule"):
        fit_population([job], [run_dir], graph=True)
    finals = []
    for graph in (False, True):
        job, run_dir = plan_job(_cfg(tmp_path / f"g{graph}"), "dpt", 0, dataset)
        fit_population([job], [run_dir], graph=graph)
        finals.append(_weights(_last(run_dir)))
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])


HOST_OPS = ("lift_fresh", "lift_fresh_copy", "_local_scalar_dense", "nonzero", "masked_select",
            "_unique2", "unique_consecutive")
"""Operators that read from or wait for the host: a tensor made from Python data (a copy from
pageable memory on a GPU), a value read back (``.item()``, ``bool()``), a shape that depends
on data. Inside a CUDA graph capture each is an error, so a captured step may have none."""


@pytest.mark.parametrize("kind", ["spice", "dpt"])
def test_a_population_step_does_only_device_work(dataset, tmp_path, kind) -> None:
    """What a GPU capture needs, checked on the CPU: one population step (the batch gather,
    the loss, backward, the per-model clip, AdamW) calls no operator that reads the host. The
    first capture on an H200 failed on exactly such a copy (a Python number in the shrinkage
    posterior)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from spice_ray.train.population import Population, Stepper, load_all, population_batch

    class HostReads(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if name in HOST_OPS:
                self.seen.append(name)
            return func(*args, **(kwargs or {}))

    jobs = [plan_job(_cfg(tmp_path), kind, s, dataset)[0] for s in (0, 1)]
    train = load_all(jobs, "train", torch.device("cpu"))
    pop = Population(kind, jobs[0].cfg, [pop_module._initial_model(j) for j in jobs],
                     torch.device("cpu"))
    stepper = Stepper(pop, lambda idx: population_batch(jobs, train, idx))
    rows = torch.arange(2 * jobs[0].cfg.train.batch_size).view(2, -1)
    stepper.run(rows)  # the optimiser's lazy state is made on the first step, as in warm-up
    with HostReads() as spy:
        stepper._body()
    assert spy.seen == []
    assert int(pop.step_t) == 2


def test_the_population_tool_trains_a_study_without_ray_and_resumes(tmp_path, capsys) -> None:
    """``tools/population_train.py``: a study's models from the datasets already in the run,
    stopped at a deadline (checkpoints written, exit 0), then resumed to finals the study's
    pretraining stage takes as current; a missing dataset is one error line."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "population_train", Path(__file__).parents[1] / "tools" / "population_train.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    run = tmp_path / "run"
    args = [str(run), "--preset", "smoke", "--experiments", "darkroom_region", "--device",
            "cpu", "--set", "train.epochs=2", "--set", "train.checkpoint_every=1",
            "--set", "seeds=[0,1]"]
    assert tool.cli(args) == 1  # no dataset yet
    cfg = make_config("smoke", "darkroom_region", overrides=["train.epochs=2", "seeds=[0,1]",
                                                              f"out_dir={run}"])
    generate_dataset(cfg, store.dataset_dir(run / "datasets", cfg))
    with torch_threads(1):
        assert tool.cli([*args, "--stop-after", "0"]) == 0
        dirs = sorted((run / "checkpoints").glob("*/spice-*-seed*"))
        assert dirs and all(not (d / "final").exists() for d in dirs)
        capsys.readouterr()
        assert tool.cli([*args, "--plan"]) == 0
        assert "population of 2 (darkroom_region spice seed 0, darkroom_region spice seed 1)" \
            ": resumes at epoch 2 of 2 (" in capsys.readouterr().out
        # a model one epoch behind trains in its own population, not restarting the other
        behind = next(d for d in dirs if d.name.endswith("seed1"))
        shutil.rmtree(sorted((behind / "local").glob("epoch-*"))[0])
        assert tool.cli([*args, "--plan"]) == 0
        plan = capsys.readouterr().out
        assert "population of 1 (darkroom_region spice seed 0): resumes at epoch 2" in plan
        assert "population of 1 (darkroom_region spice seed 1): resumes at epoch 1" in plan
        assert tool.cli(args) == 0
    for d in dirs:
        job, run_dir = plan_job(cfg, "spice", int(d.name.rsplit("seed", 1)[1]),
                                store.dataset_dir(run / "datasets", cfg))
        assert run_dir == d and settle_final(d / "final", job)
        assert ckpt.read_meta(d / "final")["epoch"] == 1
    # --alone: each model by itself with the Train workers' loop, to the same kind of final
    alone = [*args[:-1], "seeds=[0,2]", "--alone", "--threads", "1"]
    capsys.readouterr()
    assert tool.cli(alone) == 0
    out = capsys.readouterr().out
    assert "darkroom_region spice seed 0: checkpoint is current, skipped" in out
    assert "darkroom_region spice seed 2 alone: 2 epochs, final " in out
    job, run_dir = plan_job(cfg, "spice", 2, store.dataset_dir(run / "datasets", cfg))
    assert settle_final(run_dir / "final", job) and ckpt.read_meta(run_dir / "final")["epoch"] == 1
