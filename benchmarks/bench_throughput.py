"""Training-step throughput at the small configs, against the machine's measured matmul peak.

    python benchmarks/bench_throughput.py [--steps 8] [--rounds 3] [--threads 1 2]
                                          [--experiments bandit darkroom] [--kinds spice dpt]

One step is what ``spice_ray.train.loop.fit`` does per batch: the model kind's loss
(``compute_loss``), backward, the gradient clip, the finiteness check and AdamW, on one
``small`` batch (32 tasks; bandit T = 500, darkroom T = 100). Timed in this run, per
(experiment, model kind, torch threads):

  - ``baseline``: the step as it was before the throughput work: ``torch.std`` over the heads
    axis, the per-parameter AdamW loop, the fused heads recomputing their pre-activations in
    backward (the three pieces are swapped back in for the measurement);
  - ``current``: the step as training runs it now;
  - ``bf16``: the current step under CPU bf16 autocast (only where the CPU reports
    avx512_bf16 or AMX): training does not use it, this row says why.

Baseline and current steps alternate in ``--rounds`` rounds of ``--steps`` steps, so a load
that comes and goes hits both; each figure is the median step. Printed per row: ms per step,
model-steps per second, matmul FLOPs of one forward + backward (``torch.utils.flop_counter`` on
the same step with eager heads, plus causal attention's query-key pairs counted from the shapes:
:func:`attention_flops`), the achieved GFLOP/s and its share of the
machine's matmul peak at the same threads and dtype (a 2048^3 matmul, best of 5, measured in
this run), and current / baseline (target: >= 2x). Compare figures only within one run.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.model import ensemble as ensemble_module
from spice_ray.model import spice as spice_module
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import make_tokens
from spice_ray.train.loop import check_step_finite, make_optimizer
from spice_ray.train.losses import loss_for


def cpu_has_bf16() -> bool:
    """Whether the CPU reports bf16 matrix instructions (avx512_bf16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def matmul_peak(dtype: torch.dtype, n: int = 2048) -> float:
    """FLOP/s of an n x n x n matmul at the current threads, best of 5 (after 2 warm-ups)."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    times = []
    for i in range(7):
        t0 = time.perf_counter()
        a @ b
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times)


@contextmanager
def baseline_step():
    """The three pieces of the step as they were before the throughput work."""
    saved = spice_module.ensemble_mean_std, ensemble_module.KEEP_PREACTIVATIONS
    spice_module.ensemble_mean_std = lambda q: (q.mean(-2), q.std(-2, correction=1))
    ensemble_module.KEEP_PREACTIVATIONS = False
    try:
        yield
    finally:
        spice_module.ensemble_mean_std, ensemble_module.KEEP_PREACTIVATIONS = saved


class Trainer:
    """One model, its optimiser and one batch: ``step()`` is one training step."""

    def __init__(self, experiment: str, kind: str, variant: str, head_kernel: str = "auto"
                 ) -> None:
        self.cfg = make_config("small", experiment,
                               overrides=[f"model.head_kernel={head_kernel}"])
        self.kind = kind
        self.variant = variant
        self.batch = generate_tasks(self.cfg.env, self.cfg.data, "train",
                                    np.arange(self.cfg.train.batch_size))
        self.model = build_model(kind, self.cfg, torch.Generator().manual_seed(0))
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        tc = self.cfg.train
        self.optimizer = (torch.optim.AdamW(self.params, lr=tc.lr, weight_decay=tc.weight_decay)
                          if variant == "baseline" else make_optimizer(self.params, tc))

    def loss(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``compute_loss``'s forward and loss, with CPU bf16 autocast for the bf16 row
        (``compute_loss`` enables autocast on CUDA only)."""
        with ExitStack() as stack:
            if self.variant == "baseline":
                stack.enter_context(baseline_step())
            stack.enter_context(torch.autocast("cpu", dtype=torch.bfloat16,
                                               enabled=self.variant == "bf16"))
            tokens = make_tokens(self.batch, self.cfg.env)
            out = self.model(tokens)
            ids = torch.as_tensor(self.batch["task_id"])
            return loss_for(self.kind)(out, tokens, self.model, ids, self.cfg.train)

    def step(self) -> None:
        loss, comp = self.loss()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.train.grad_clip)
        check_step_finite(loss, norm, "benchmark", comp, sync=False)
        self.optimizer.step()


def attention_flops(cfg) -> float:
    """FLOPs of causal self-attention's matmuls in one forward + backward, every layer.

    Per layer and sequence of L = T + 1 positions, the L (L + 1) / 2 query-key pairs a causal
    mask keeps each cost 2 D FLOPs in each of QK^T and PV (forward) and in each of dP, dV, dQ
    and dK (backward): 12 D L (L + 1) / 2. ``torch.utils.flop_counter`` has no formula for
    the CPU flash-attention kernel, so these are added to its count.
    """
    L = cfg.env.horizon + 1
    return cfg.model.n_layer * cfg.train.batch_size * 6.0 * cfg.model.n_embd * L * (L + 1)


def step_flops(experiment: str, kind: str) -> float:
    """Matmul FLOPs of one forward + backward: the linear layers and heads as
    ``torch.utils.flop_counter`` counts them (eager heads: the same math, countable) plus
    :func:`attention_flops`."""
    trainer = Trainer(experiment, kind, "current", head_kernel="eager")
    counter = FlopCounterMode(display=False)
    with counter:
        loss, _ = trainer.loss()
        loss.backward()
    return float(counter.get_total_flops()) + attention_flops(trainer.cfg)


def time_interleaved(trainers: dict[str, Trainer], steps: int, rounds: int
                     ) -> dict[str, float]:
    """Median seconds per step of each trainer, their steps alternating in rounds."""
    for t in trainers.values():
        t.step()  # warm-up (compiles the fused heads once per process)
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, t in trainers.items():
            for _ in range(steps):
                t0 = time.perf_counter()
                t.step()
                times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(v)) for name, v in times.items()}


def row(label: str, seconds: float, flops: float, peak: float) -> str:
    achieved = flops / seconds
    return (f"  {label:9s} {seconds * 1e3:8.1f} ms {1 / seconds:7.2f} steps/s "
            f"{achieved / 1e9:7.1f} GFLOP/s = {100 * achieved / peak:5.1f}% of peak")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", nargs="+", default=["bandit", "darkroom"])
    p.add_argument("--kinds", nargs="+", default=["spice", "dpt"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--steps", type=int, default=8, help="steps per round and variant")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    bf16 = cpu_has_bf16()
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"bf16 matrix instructions: {'yes' if bf16 else 'no'}")
    flops = {(e, k): step_flops(e, k) for e in args.experiments for k in args.kinds}
    summary: list[tuple[str, float]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = {"fp32": matmul_peak(torch.float32)}
        if bf16:
            peak["bf16"] = matmul_peak(torch.bfloat16)
        print(f"\n{threads} thread(s): matmul peak "
              + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items()))
        for experiment in args.experiments:
            for kind in args.kinds:
                variants = ["baseline", "current"] + (["bf16"] if bf16 else [])
                trainers = {v: Trainer(experiment, kind, v) for v in variants}
                sec = time_interleaved(trainers, args.steps, args.rounds)
                cfg = trainers["current"].cfg
                f = flops[(experiment, kind)]
                print(f"{experiment} {kind} (small: T={cfg.env.horizon}, batch "
                      f"{cfg.train.batch_size}, {cfg.model.n_layer} layers x {cfg.model.n_embd}"
                      + (f", K={cfg.model.ensemble_size}" if kind == "spice" else "")
                      + f"): {f / 1e9:.2f} GFLOP of matmuls per step")
                for v in variants:
                    print(row(v, sec[v], f, peak["bf16" if v == "bf16" else "fp32"]))
                ratio = sec["baseline"] / sec["current"]
                print(f"  current / baseline: {ratio:.2f}x model-steps per second "
                      "(target >= 2x)"
                      + (f"; bf16 / current: {sec['current'] / sec['bf16']:.2f}x" if bf16
                         else ""))
                summary.append((f"{experiment} {kind} {threads} thread(s)", ratio))
    print("\ncurrent / baseline model-steps per second:")
    for label, ratio in summary:
        print(f"  {label:28s} {ratio:.2f}x")


if __name__ == "__main__":
    main()
