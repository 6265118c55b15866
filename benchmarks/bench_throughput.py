"""Training-step throughput at the small configs, against the machine's measured matmul peak.

    python benchmarks/bench_throughput.py [--steps 8] [--rounds 3] [--threads 1 2]
                                          [--experiments bandit darkroom] [--kinds spice dpt]
                                          [--device cuda] [--batch 32 256]

One step is what ``spice_ray.train.loop.fit`` does per batch: the model kind's loss
(``compute_loss``), backward, the gradient clip, the finiteness check and AdamW, on one
``small`` batch (32 tasks; bandit T = 500, darkroom T = 100). Timed in this run, per
(experiment, model kind, torch threads):

  - ``baseline``: the step as it was before the throughput work: ``torch.std`` over the heads
    axis, the per-parameter AdamW loop, the fused heads recomputing their pre-activations in
    backward (the three pieces are swapped back in for the measurement);
  - ``current``: the step as training runs it now;
  - ``bf16``: the current step under bf16 autocast: on a CPU only where it reports
    avx512_bf16 or AMX (training does not use it there, this row says why); on a GPU
    (``--device cuda``) always, and it is what training runs there (``train.use_gpu``).

Baseline and current steps alternate in ``--rounds`` rounds of ``--steps`` steps, so a load
that comes and goes hits both; each figure is the median step. Printed per row: ms per step,
model-steps per second, matmul FLOPs of one forward + backward (``torch.utils.flop_counter`` on
the same step with eager heads, plus causal attention's query-key pairs counted from the shapes:
``spice_ray.train.rates.attention_flops``), the achieved GFLOP/s and its share of the
machine's matmul peak at the same threads and dtype (a 2048^3 matmul on a CPU, 8192^3 on a
GPU, best of 5, measured in this run), and current / baseline (target: >= 2x). ``--batch``
times larger batches too (the step's FLOPs scale with it): a GPU's share of its peak at the
small batch says how far a step there is from its arithmetic limit. Compare figures only
within one run.
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np
import torch

from spice_ray.config import make_config
from spice_ray.data.tasks import generate_tasks
from spice_ray.model import ensemble as ensemble_module
from spice_ray.model import spice as spice_module
from spice_ray.model.registry import build_model
from spice_ray.model.tokens import make_tokens
from spice_ray.train import rates
from spice_ray.train.loop import make_optimizer, optimiser_step
from spice_ray.train.losses import loss_for


def cpu_has_bf16() -> bool:
    """Whether the CPU reports bf16 matrix instructions (avx512_bf16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def sync(device: torch.device) -> None:
    """Wait for the device's queued kernels (a no-op on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(dtype: torch.dtype, device: torch.device) -> float:
    """FLOP/s of an n x n x n matmul at the current threads, best of 5 (after 2 warm-ups);
    n = 2048 on a CPU, 8192 on a GPU."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n).to(device, dtype)
    b = torch.randn(n, n).to(device, dtype)
    times = []
    for i in range(7):
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
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

    def __init__(self, experiment: str, kind: str, variant: str, head_kernel: str = "auto",
                 device: torch.device | None = None, batch: int = 0) -> None:
        self.cfg = make_config("small", experiment,
                               overrides=[f"model.head_kernel={head_kernel}"]
                               + ([f"train.batch_size={batch}"] if batch else []))
        self.kind = kind
        self.variant = variant
        self.device = device = device or torch.device("cpu")
        batch_np = generate_tasks(self.cfg.env, self.cfg.data, "train",
                                  np.arange(self.cfg.train.batch_size))
        self.batch = {k: torch.as_tensor(v).to(device) for k, v in batch_np.items()}
        self.model = build_model(kind, self.cfg, torch.Generator().manual_seed(0)).to(device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        tc = self.cfg.train
        self.optimizer = (torch.optim.AdamW(self.params, lr=tc.lr, weight_decay=tc.weight_decay)
                          if variant == "baseline" else make_optimizer(self.params, tc))

    def loss(self) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``compute_loss``'s forward and loss, with bf16 autocast for the bf16 row only
        (``compute_loss`` enables it on CUDA always)."""
        with ExitStack() as stack:
            if self.variant == "baseline":
                stack.enter_context(baseline_step())
            stack.enter_context(torch.autocast(self.device.type, dtype=torch.bfloat16,
                                               enabled=self.variant == "bf16"))
            tokens = make_tokens(self.batch, self.cfg.env, device=self.device)
            out = self.model(tokens)
            ids = self.batch["task_id"]
            return loss_for(self.kind)(out, tokens, self.model, ids, self.cfg.train)

    def step(self) -> None:
        loss, comp = self.loss()
        optimiser_step(loss, self.optimizer, self.params, self.cfg.train.grad_clip, "benchmark",
                       comp)


def step_flops(experiment: str, kind: str, batch: int = 0) -> float:
    """Matmul FLOPs of one forward + backward of the ``small`` config at ``batch`` (0: its
    own), counted as the dry run counts them (``spice_ray.train.rates.step_flops``)."""
    return rates.step_flops(make_config("small", experiment), kind, batch or None)


def time_interleaved(trainers: dict[str, Trainer], steps: int, rounds: int
                     ) -> dict[str, float]:
    """Median seconds per step of each trainer, their steps alternating in rounds."""
    for t in trainers.values():
        for _ in range(2):
            t.step()  # warm-up (compiles the fused heads, autotunes the GPU's kernels)
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(rounds):
        for name, t in trainers.items():
            for _ in range(steps):
                sync(t.device)
                t0 = time.perf_counter()
                t.step()
                sync(t.device)
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
    p.add_argument("--device", default="cpu", help="cpu or cuda (bf16 row under autocast)")
    p.add_argument("--batch", nargs="+", type=int, default=[0],
                   help="batch sizes to time (0: the small preset's 32)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        bf16 = torch.cuda.is_available()
        if not bf16:
            p.error("--device cuda: torch sees no CUDA device here")
        # fp32 rows in true fp32, as on a CPU (no TF32 matmuls): the bf16 row is the fast one
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device)}")
    else:
        bf16 = cpu_has_bf16()
        print(f"torch {torch.__version__}, CPU capability "
              f"{torch.backends.cpu.get_cpu_capability()}, "
              f"bf16 matrix instructions: {'yes' if bf16 else 'no'}")
    flops = {(e, k, b): step_flops(e, k, b)
             for e in args.experiments for k in args.kinds for b in args.batch}
    summary: list[tuple[str, float]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak = {"fp32": matmul_peak(torch.float32, device)}
        if bf16:
            peak["bf16"] = matmul_peak(torch.bfloat16, device)
        print(f"\n{threads} thread(s), {device.type}: matmul peak "
              + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peak.items()))
        for experiment, kind, b in flops:
            variants = ["baseline", "current"] + (["bf16"] if bf16 else [])
            trainers = {v: Trainer(experiment, kind, v, device=device, batch=b)
                        for v in variants}
            sec = time_interleaved(trainers, args.steps, args.rounds)
            cfg = trainers["current"].cfg
            f = flops[(experiment, kind, b)]
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
            summary.append((f"{experiment} {kind} B={cfg.train.batch_size} "
                            f"{threads} thread(s)", ratio))
    print("\ncurrent / baseline model-steps per second:")
    for label, ratio in summary:
        print(f"  {label:36s} {ratio:.2f}x")


if __name__ == "__main__":
    main()
