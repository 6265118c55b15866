"""A population's batches: each dataset split made into tokens once and kept on the training
device, and each model's epoch order as row indices (``spice_ray.train.population``).

A model's batches are those a one-worker Ray Train job reads (``stream.shard_batches``: the
split in chunks of ``max(data.shard_size, train.batch_size)`` rows in task order, each chunk
shuffled by the (seed, epoch) generator), as indices into the split, so a population gathers
every model's batch on the device with one index per token field and no host work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from spice_ray.data import store
from spice_ray.model.tokens import Tokens, make_tokens
from spice_ray.train.loop import TrainJob

TOKEN_FIELDS = tuple(f.name for f in dataclasses.fields(Tokens))
"""The token fields in ``Tokens``' order: what a population step takes, stacked per model."""


def epoch_order(chunk_rows: Sequence[int], batch_size: int, rng: np.random.Generator,
                num_rows: int) -> np.ndarray:
    """Row indices of one epoch's batches, [steps, batch_size]: the batches that
    :func:`spice_ray.train.stream.shuffled_batches` makes from chunks of these sizes with this
    ``rng`` on one worker (each chunk plus the rows left over from the last is permuted and cut
    into batches), as indices into the split's rows in file order."""
    rounds = num_rows // batch_size
    out: list[np.ndarray] = []
    carry = np.empty(0, dtype=np.int64)
    start = 0
    for n_chunk in chunk_rows:
        idx = np.concatenate([carry, np.arange(start, start + n_chunk, dtype=np.int64)])
        start += n_chunk
        perm = rng.permutation(len(idx))
        full = len(idx) - len(idx) % batch_size
        for lo in range(0, full, batch_size):
            if len(out) >= rounds:
                return np.stack(out)
            out.append(idx[perm[lo:lo + batch_size]])
        carry = idx[perm[full:]]
    return np.stack(out) if out else np.empty((0, batch_size), dtype=np.int64)


@dataclasses.dataclass
class Split:
    """One dataset split as tokens on the training device, rows in file order."""

    tokens: dict[str, Tensor]
    task_id: Tensor
    chunk_rows: list[int]

    @property
    def num_rows(self) -> int:
        return int(self.task_id.shape[0])

    def take(self, idx: Tensor) -> tuple[list[Tensor], Tensor]:
        """The token fields and task ids of rows ``idx`` (any shape)."""
        return [self.tokens[f][idx] for f in TOKEN_FIELDS], self.task_id[idx]


def load_split(job: TrainJob, split: str, device: torch.device) -> Split:
    """``split`` of ``job``'s dataset, read as the loop reads it: in chunks of
    ``max(data.shard_size, train.batch_size)`` rows in task order (the chunks that fix the
    shuffle), made into tokens once, and moved to ``device``."""
    from spice_ray.train.stream import in_task_order

    cfg = job.cfg
    chunks = store.iter_batches(job.dataset_dir, split, max(cfg.data.shard_size,
                                                            cfg.train.batch_size))
    parts, sizes, ids = [], [], []
    for chunk in in_task_order(chunks):
        tok = make_tokens(chunk, cfg.env)
        parts.append(tok)
        ids.append(torch.as_tensor(np.asarray(chunk["task_id"])))
        sizes.append(int(tok.actions.shape[0]))
    if not parts:
        raise store.DatasetError(f"{job.dataset_dir}: split {split} has no rows")
    tokens = {f: torch.cat([getattr(p, f) for p in parts]).to(device) for f in TOKEN_FIELDS}
    return Split(tokens, torch.cat(ids).to(device), sizes)


def load_all(jobs: Sequence[TrainJob], split: str, device: torch.device) -> dict[str, Split]:
    """Each distinct dataset's split once (models of one dataset share it)."""
    out: dict[str, Split] = {}
    for job in jobs:
        if job.dataset_dir not in out:
            out[job.dataset_dir] = load_split(job, split, device)
    return out


def population_batch(jobs: Sequence[TrainJob], data: Mapping[str, Split], idx: Tensor
                      ) -> tuple[list[Tensor], Tensor]:
    """The M models' batches ([M, B, ...] per token field, ids [M, B]) for row indices
    ``idx`` [M, B] into each model's own dataset; one gather per field when they share one."""
    sources = {job.dataset_dir for job in jobs}
    if len(sources) == 1:
        return data[jobs[0].dataset_dir].take(idx)
    per = [data[job.dataset_dir].take(idx[m]) for m, job in enumerate(jobs)]
    fields = [torch.stack([p[0][i] for p in per]) for i in range(len(TOKEN_FIELDS))]
    return fields, torch.stack([p[1] for p in per])
