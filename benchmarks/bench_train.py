"""Training-step throughput at the paper's config: DPT vs SPICE vs SPICE with a per-head loop.

    python benchmarks/bench_train.py [--batch 64] [--horizon 500] [--steps 3] [--device cpu]

One optimisation step = forward over the whole [query; context] sequence, the full loss, backward
and AdamW. Measured in the same run on the same random batch:
  - DPT (trunk + policy head, cross-entropy),
  - SPICE (vectorised K-head ensemble, the full SPICE loss; heads as model.head_kernel="auto"
    runs them: the fused kernels compiled by torch.compile where that works),
  - SPICE with the same fused heads run eagerly (head_kernel="eager": no compiler needed),
  - SPICE with a naive ensemble that loops over heads and actions (the authors' reference design).
Then the ensemble alone (forward + backward on fixed latents), vectorised vs loop.
Targets (issue 3): SPICE's step <= 1.5x DPT's; the vectorised ensemble >= 3x faster than the loop.
On a GPU (--device cuda) the steps run under bf16 autocast.

Then (``--seeds S``, default 3; 0 skips it) S seeds of SPICE at the paper's config on Ray Train,
CPU, one Train worker as the small study runs them: each seed in its own job, one after
another (``train.together=false``), against all S in one job (``train.together``), each wall
time including its job's start-up, and all S in one job on two one-thread workers side by
side (``train.num_workers=2``, as the small darkroom experiments train). Printed: the walls and
their ratios, and the fixed start-up per model (job wall minus the seconds inside ``fit``)
before and after. Target (issue 19): ratio >= 2x. The ratio grows as a model's compute shrinks
against the start-up; the line says at how many steps per model it was measured.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from loop_ensemble import LoopEnsemble  # beside this script

from spice_ray.config import make_config
from spice_ray.model import ensemble as ensemble_module
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import make_tokens
from spice_ray.train.loop import compute_loss


def random_batch(batch: int, horizon: int, arms: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(arms), size=batch).astype(np.float32)
    return {"actions": rng.integers(arms, size=(batch, horizon), dtype=np.uint8),
            "rewards": rng.normal(0.5, 0.3, size=(batch, horizon)).astype(np.float32),
            "behaviour_probs": probs, "label": rng.integers(arms, size=batch, dtype=np.uint8),
            "task_id": np.arange(batch, dtype=np.int64)}  # the loss keys head targets by task


def time_steps(model, kind, cfg, batch, steps: int, device: torch.device) -> float:
    """Median seconds per optimisation step (after one warm-up step, which also compiles)."""
    model.to(device).train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    tokens_batch = {k: torch.as_tensor(v).to(device) for k, v in batch.items()}
    make_tokens(tokens_batch, cfg.env)  # validate shapes once
    times = []
    for i in range(steps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss, _ = compute_loss(model, tokens_batch, kind, cfg, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def time_ensemble(ens, latent: torch.Tensor, steps: int) -> float:
    """Median seconds of one forward + backward through the ensemble alone (after a warm-up)."""
    times = []
    for i in range(steps + 1):
        h = latent.detach().requires_grad_(True)
        t0 = time.perf_counter()
        ens(h).square().mean().backward()
        if latent.device.type == "cuda":
            torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def bench_seeds(seeds: int, train_tasks: int, epochs: int, batch: int) -> None:
    """S seeds trained one job each vs together in one job (see the module's docstring)."""
    import tempfile
    from pathlib import Path

    import ray

    from spice_ray.data.generate import generate_dataset
    from spice_ray.runtime.cli import init_ray
    from spice_ray.train.loop import steps_per_epoch
    from spice_ray.train.ray_train import plan_job, train_with_ray
    from spice_ray.train.together import ModelSpec, pretrain_many

    init_ray(num_cpus=2, dashboard=False)  # as a run starts it (its workers at nice 0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        sets = [f"data.num_train_tasks={train_tasks}", "data.num_val_tasks=64",
                "data.num_eval_tasks=64", "eval.num_tasks=64", f"data.shard_size={train_tasks}",
                f"train.epochs={epochs}", f"train.batch_size={batch}", "train.num_workers=1",
                "train.worker_cpus=0.5", "train.use_gpu=false", "seeds=[0,1,2]"]
        cfg = make_config("paper", "bandit", overrides=sets, extra={"out_dir": str(root)})
        ds = generate_dataset(cfg, root / "ds").dataset_dir
        steps = epochs * steps_per_epoch(cfg)
        t0 = time.perf_counter()
        alone_fit = 0.0
        for seed in range(seeds):
            job, run_dir = plan_job(cfg, "spice", seed, ds, root / "alone")
            alone_fit += train_with_ray(job, run_dir).worker_return["fit_seconds"]
        alone = time.perf_counter() - t0
        specs = [ModelSpec(cfg, "spice", seed, f"seed {seed}") for seed in range(seeds)]
        _, timing = pretrain_many(specs, ds, root / "together")
        together = timing["seconds"]
        together_fit = sum(timing["models"].values())
        side_cfg = make_config("paper", "bandit", overrides=[*sets, "train.num_workers=2"],
                               extra={"out_dir": str(root)})
        side_specs = [ModelSpec(side_cfg, "spice", seed, f"seed {seed}")
                      for seed in range(seeds)]
        _, side_timing = pretrain_many(side_specs, ds, root / "side")
        side = side_timing["seconds"]
    ray.shutdown()
    print(f"{seeds} SPICE seeds, paper config (T=500, {cfg.model.n_layer} layers, width "
          f"{cfg.model.n_embd}, K={cfg.model.ensemble_size}), {steps} steps of batch {batch} "
          "each, Ray Train, 1 CPU worker:")
    print(f"  one job per seed:  {alone:7.1f} s ({alone_fit:.1f} s in fit; start-up "
          f"{(alone - alone_fit) / seeds:.1f} s per model)")
    print(f"  one job for all:   {together:7.1f} s ({together_fit:.1f} s in fit; start-up "
          f"{(together - together_fit) / seeds:.1f} s per model, "
          f"{together - together_fit:.1f} s per job)")
    print(f"  one job, 2 one-thread workers side by side: {side:7.1f} s")
    print(f"one job per seed / together:      {alone / together:.2f}x (target >= 2x)")
    print(f"one job per seed / together on 2 workers: {alone / side:.2f}x (target >= 2x)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--horizon", type=int, default=500)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds for the together-vs-alone figure (0: skip it)")
    p.add_argument("--train-tasks", type=int, default=256,
                   help="training tasks of that figure's dataset (steps per model: this over "
                        "--batch, times --epochs)")
    p.add_argument("--epochs", type=int, default=1)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg = make_config("paper", "bandit", overrides=[f"env.horizon={args.horizon}",
                                                    f"train.batch_size={args.batch}"])
    batch = random_batch(args.batch, args.horizon, cfg.env.num_arms)
    gen = torch.Generator().manual_seed(0)
    results = {}
    results["dpt"] = time_steps(build_model("dpt", cfg, gen), "dpt", cfg, batch, args.steps,
                                device)
    spice = build_model("spice", cfg, torch.Generator().manual_seed(0))
    results["spice"] = time_steps(spice, "spice", cfg, batch, args.steps, device)
    eager = build_model("spice", cfg, torch.Generator().manual_seed(0))
    eager.ensemble.kernel = "eager"
    results["spice_eager"] = time_steps(eager, "spice", cfg, batch, args.steps, device)
    looped = build_model("spice", cfg, torch.Generator().manual_seed(0))
    looped.ensemble = LoopEnsemble.from_vectorised(looped.ensemble)
    results["spice_loop"] = time_steps(looped, "spice", cfg, batch, args.steps, device)

    latent = torch.randn(args.batch, args.horizon + 1, cfg.model.n_embd,
                         generator=torch.Generator().manual_seed(1)).to(device)
    ens_vec = time_ensemble(spice.ensemble.to(device), latent, args.steps)
    ens_eager = time_ensemble(eager.ensemble.to(device), latent, args.steps)
    ens_loop = time_ensemble(looped.ensemble.to(device), latent, args.steps)

    heads = ("eager (torch.compile failed: " + ensemble_module._compile_error + ")"
             if ensemble_module._compile_error else "compiled")
    print(f"device={device} threads={torch.get_num_threads()} B={args.batch} T={args.horizon} "
          f"A={cfg.env.num_arms} K={cfg.model.ensemble_size} layers={cfg.model.n_layer} "
          f"width={cfg.model.n_embd} head_hidden={cfg.model.head_hidden}")
    print(f"head_kernel=auto ran the heads {heads}")
    for name, sec in results.items():
        print(f"  {name:11s} {sec * 1e3:9.1f} ms/step  {args.batch / sec:9.1f} samples/s")
    print(f"SPICE / DPT step time:            {results['spice'] / results['dpt']:.2f}x "
          f"(target <= 1.5x; the authors' reference code: ~5x); with eager heads "
          f"{results['spice_eager'] / results['dpt']:.2f}x")
    print(f"ensemble alone (fwd+bwd on [B, T+1, D] latents): vectorised {ens_vec * 1e3:.1f} ms "
          f"(eager heads {ens_eager * 1e3:.1f} ms), loop {ens_loop * 1e3:.1f} ms")
    print(f"loop / vectorised ensemble:       {ens_loop / ens_vec:.2f}x (target >= 3x); "
          f"with eager heads {ens_loop / ens_eager:.2f}x")
    print(f"loop-ensemble SPICE / SPICE step: {results['spice_loop'] / results['spice']:.2f}x "
          "(whole step, trunk included)")
    if args.seeds > 0:
        bench_seeds(args.seeds, args.train_tasks, args.epochs, args.batch)


if __name__ == "__main__":
    main()
