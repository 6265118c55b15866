"""Models trained as one population against the same models trained one at a time.

    python benchmarks/bench_population.py [--device cuda] [--models 1 3 8 24 48]
                                          [--experiments bandit darkroom] [--kinds spice dpt]
                                          [--steps 10] [--rounds 3] [--threads 2]

Per (experiment, model kind) at the ``small`` config (bandit T = 500, darkroom T = 100, batch
32), one batch of generated tasks resident on the device:

  - ``alone``: one model's training step as ``spice_ray.train.loop.fit`` takes it (the kind's
    loss, backward, gradient clip, the per-step finiteness check, fused AdamW; bf16 autocast on
    a GPU), the path every Train worker runs today; M models trained one after another give
    the same model-steps per second whatever M is;
  - ``population M``: one step of M models stacked as one (``spice_ray.train.population``:
    vmap of the same loss over the stacked weights, per-model clip, one AdamW), M models'
    steps at once;
  - ``graph M`` (GPU only): the same population step captured once as a CUDA graph and
    replayed (``spice_ray.train.population.Stepper``, what ``fit_population`` runs on a GPU),
    with the batch gathered inside the step as training does. After the timings, one check
    per kind: M = 3 trained 20 steps eagerly, again eagerly and captured, from the same
    weights; the largest weight difference graph - eager beside eager - eager (the GPU's own
    run-to-run rounding).

Printed per row: ms per step, model-steps per second, the achieved matmul FLOP/s (the dry
run's count of one model's forward + backward, ``spice_ray.train.rates.step_flops``, times M)
as a share of the machine's matmul peak measured in this run (fp32 on a CPU, bf16 on a GPU),
and population / alone in model-steps per second. Alone and population steps alternate in
``--rounds`` rounds, so a load that comes and goes hits both; each figure is the median.
Compare figures only within one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch
from bench_throughput import matmul_peak, sync  # beside this script

from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import make_tokens
from spice_ray.train import rates
from spice_ray.train.loop import compute_loss, make_optimizer, optimiser_step
from spice_ray.train.population import TOKEN_FIELDS, Population, Stepper


def median_seconds(steps: dict[str, Callable[[], None]], device: torch.device, n: int,
                   rounds: int) -> dict[str, float]:
    """Median seconds per call of each step, the steps alternating in rounds (2 warm-ups)."""
    for fn in steps.values():
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name, fn in steps.items():
            for _ in range(n):
                sync(device)
                t0 = time.perf_counter()
                fn()
                sync(device)
                times[name].append(time.perf_counter() - t0)
    return {k: float(np.median(v)) for k, v in times.items()}


def population(kind: str, cfg, M: int, device: torch.device) -> Population:
    """M models of ``kind`` seeded 0..M-1, stacked."""
    return Population(kind, cfg, [build_model(kind, cfg, torch.Generator().manual_seed(s))
                                  for s in range(M)], device)


def gathered(stacked: list[torch.Tensor], ids: torch.Tensor):
    """A batch function for :class:`Stepper` that gathers rows of one resident batch (row
    ``i`` of model ``m`` is the batch's row ``i``), as training gathers from its split."""
    def batch_of(idx: torch.Tensor):
        rows = idx + torch.arange(idx.shape[1], device=idx.device)
        return ([f.gather(1, rows.view(*rows.shape, *(1,) * (f.dim() - 2))
                          .expand(*rows.shape, *f.shape[2:])) for f in stacked],
                ids.gather(1, rows))
    return batch_of


def trained(kind: str, cfg, device: torch.device, batch_of, graph: bool, n: int = 20
            ) -> dict[str, torch.Tensor]:
    """Three models' weights after ``n`` steps, eagerly or captured."""
    stepper = Stepper(population(kind, cfg, 3, device), batch_of, graph=graph)
    rows = torch.zeros_like(stepper.idx)
    for _ in range(n):
        stepper.run(rows)
    return {k: v.detach().float().clone() for k, v in stepper.pop.params.items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", nargs="+", type=int, default=None,
                   help="population sizes (default: 1 3 8 on a CPU, 1 3 8 24 48 on a GPU)")
    p.add_argument("--experiments", nargs="+", default=["bandit", "darkroom"])
    p.add_argument("--kinds", nargs="+", default=["spice", "dpt"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-graph", action="store_true",
                   help="on a GPU, leave out the captured (CUDA graph) rows")
    args = p.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    gpu = device.type == "cuda"
    sizes = args.models or ([1, 3, 8, 24, 48] if gpu else [1, 3, 8])
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = False
        name = torch.cuda.get_device_name(device)
    else:
        name = f"CPU, {args.threads} thread(s)"
    dtype = torch.bfloat16 if gpu else torch.float32
    peak = matmul_peak(dtype, device)
    print(f"torch {torch.__version__}, {name}: {str(dtype).split('.')[-1]} matmul peak "
          f"{peak / 1e12:.2f} TFLOP/s")
    summary = []
    for experiment in args.experiments:
        cfg = make_config("small", experiment)
        batch_np = generate_tasks(cfg.env, cfg.data, "train", np.arange(cfg.train.batch_size))
        batch = {k: torch.as_tensor(v).to(device) for k, v in batch_np.items()}
        tokens = make_tokens(batch, cfg.env, device=device)
        fields = [getattr(tokens, f) for f in TOKEN_FIELDS]
        ids = torch.as_tensor(batch_np["task_id"]).to(device)
        for kind in args.kinds:
            flops = rates.step_flops(cfg, kind)
            model = build_model(kind, cfg, torch.Generator().manual_seed(0)).to(device)
            params = [q for q in model.parameters() if q.requires_grad]
            opt = make_optimizer(params, cfg.train)

            def alone(model=model, params=params, opt=opt, kind=kind, cfg=cfg, batch=batch):
                loss, comp = compute_loss(model, batch, kind, cfg, device)
                optimiser_step(loss, opt, params, cfg.train.grad_clip, "benchmark", comp)

            steps: dict[str, Callable[[], None]] = {"alone": alone}
            for M in sizes:
                stacked = [f.unsqueeze(0).expand(M, *f.shape) for f in fields]
                ids_m = ids.unsqueeze(0).expand(M, *ids.shape)
                pop = population(kind, cfg, M, device)
                steps[f"population {M}"] = (
                    lambda pop=pop, stacked=stacked, ids_m=ids_m: pop.step(stacked, ids_m))
                if gpu and not args.no_graph:
                    stepper = Stepper(population(kind, cfg, M, device),
                                      gathered(stacked, ids_m), graph=True)
                    rows = torch.zeros_like(stepper.idx)
                    steps[f"graph {M}"] = lambda stepper=stepper, rows=rows: stepper.run(rows)
            sec = median_seconds(steps, device, args.steps, args.rounds)
            print(f"\n{experiment} {kind} (small: T={cfg.env.horizon}, batch "
                  f"{cfg.train.batch_size}, {cfg.model.n_layer} layers x {cfg.model.n_embd}): "
                  f"{flops / 1e9:.2f} GFLOP of matmuls per model-step")
            base = 1 / sec["alone"]
            if gpu and not args.no_graph:
                stacked = [f.unsqueeze(0).expand(3, *f.shape) for f in fields]
                ids_m = ids.unsqueeze(0).expand(3, *ids.shape)
                eager = [trained(kind, cfg, device, gathered(stacked, ids_m), False)
                         for _ in range(2)]
                captured = trained(kind, cfg, device, gathered(stacked, ids_m), True)
                graph_diff, floor = max_diff(captured, eager[0]), max_diff(eager[1], eager[0])
                # the captured step must do the eager step's arithmetic: its difference no
                # larger than the GPU's own run-to-run rounding (or bf16's, if that is 0)
                ok = graph_diff <= 10 * max(floor, 1e-3)
                print(f"  20 steps, M = 3: largest weight difference graph - eager "
                      f"{graph_diff:.2e}, eager - eager {floor:.2e}: graph check "
                      f"{'ok' if ok else 'FAILED'}")
            for label, s in sec.items():
                M = 1 if label == "alone" else int(label.split()[-1])
                rate = M / s
                print(f"  {label:14s} {s * 1e3:8.1f} ms {rate:9.1f} model-steps/s "
                      f"{100 * flops * M / s / peak:6.2f}% of peak  {rate / base:6.2f}x alone")
                if label != "alone":
                    summary.append((f"{experiment} {kind} M={M}", rate, rate / base))
    print("\npopulation / alone, model-steps per second:")
    for label, rate, ratio in summary:
        print(f"  {label:24s} {rate:9.1f} model-steps/s  {ratio:6.2f}x")


if __name__ == "__main__":
    main()
