"""The batches a model trains on, one stream wherever it trains: in the driver
(``train.num_workers=0``, ``tools/population_train.py --alone``), in a Ray Train worker alone,
data-parallel or side by side with others (``train.together``), or stacked in a population.
Every reader takes the train split's Parquet shards in file order and cuts them into batches
with a generator keyed by (seed, epoch) (:func:`shuffled_batches`), so a model's training
identity (``TrainJob.identity``, which leaves out where and on how many workers it trains)
fixes its batches, and so its weights up to rounding.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from spice_ray.data import store

if TYPE_CHECKING:
    from spice_ray.train.loop import TrainJob


def shuffled_batches(
    chunks: Iterable[Mapping[str, Tensor]],
    batch_size: int,
    rng: np.random.Generator,
    num_rows: int,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[dict[str, Tensor]]:
    """This worker's batches of one epoch from a stream of row chunks, reproducibly.

    Each chunk (plus the rows left over from the previous one) is permuted with ``rng`` and cut
    into batches of ``batch_size``; batch i goes to worker ``i % world_size``. Every worker sees
    the same stream and the same ``rng``, so together they split the epoch without talking, and
    each takes ``num_rows // batch_size // world_size`` batches (DDP needs equal step counts).
    Unlike a shuffle buffer filled as data arrive, nothing here depends on timing.

    Args:
        chunks: dicts of tensors [n, ...] in a fixed order (e.g. one Parquet shard each).
        batch_size: rows per batch (per worker).
        rng: the epoch's generator, e.g. ``np.random.default_rng([seed, epoch])``.
        num_rows: rows in the whole stream.
        rank, world_size: this worker and the number of workers.
    """
    rounds = num_rows // batch_size // world_size
    index = 0
    carry: dict[str, Tensor] | None = None
    for chunk in chunks:
        cols = {k: _tensor(v) for k, v in chunk.items()}
        if carry is not None:
            cols = {k: torch.cat([carry[k], v]) for k, v in cols.items()}
        n = len(next(iter(cols.values())))
        perm = torch.from_numpy(rng.permutation(n))
        full = n - n % batch_size
        for lo in range(0, full, batch_size):
            if index >= rounds * world_size:
                return
            if index % world_size == rank:
                yield {k: v[perm[lo:lo + batch_size]] for k, v in cols.items()}
            index += 1
        carry = {k: v[perm[full:]] for k, v in cols.items()}


def _tensor(v: Any) -> Tensor:
    """``v`` as a tensor without a copy. Arrow hands out read-only arrays; nothing here writes
    to them (batches are gathered copies), so torch's warning about that is silenced here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.as_tensor(v)


def in_task_order(chunks: Iterable[Mapping[str, Tensor]]) -> Iterator[Mapping[str, Tensor]]:
    """Pass chunks through, refusing any whose task ids are not increasing across the stream:
    the batches (and so the weights) are only reproducible from a stream in file order.

    Raises:
        RuntimeError: naming the first out-of-order task id.
    """
    last = -1
    for chunk in chunks:
        ids = np.asarray(chunk["task_id"])  # read only: no tensor needed
        if len(ids) and (int(ids[0]) <= last or bool((ids[1:] <= ids[:-1]).any())):
            raise RuntimeError(f"training rows arrived out of task order (task {int(ids[0])} "
                               f"after {last}): the same seed would not give the same weights")
        if len(ids):
            last = int(ids[-1])
        yield chunk


def shard_batches(job: TrainJob, epoch: int, batch_size: int, rank: int,
                  world_size: int) -> Iterator[dict[str, Any]]:
    """Every worker reads the whole train split from its Parquet shards in file order, in
    chunks of ``max(data.shard_size, batch_size)`` rows, and keeps its share of
    :func:`shuffled_batches`: the same seed gives the same batches whatever the timing.

    The workers read the run directory's files themselves (on a cluster it is one shared
    file system, as for checkpoints), unverified: the driver verifies them before a job
    (``ray_train.verify_dataset``), the in-driver loop each epoch. Ray Data's ingestion was
    used before and gave the same chunks, but since every worker reads the whole split
    (nothing to shard), it only added to each job's start-up (two split-coordinator actors, a
    read execution every epoch): 3.5 of 17 s of a one-epoch smoke job on 2 cores.
    """
    train_rows = int(store.load_manifest(job.dataset_dir).split("train")["num_rows"])
    chunks = store.iter_batches(job.dataset_dir, "train", max(job.cfg.data.shard_size,
                                                               batch_size), verify=False)
    return shuffled_batches(in_task_order(chunks), batch_size,
                            np.random.default_rng([job.seed, epoch]), train_rows, rank,
                            world_size)


def val_shard_batches(job: TrainJob, batch_size: int, verify: bool = False
                      ) -> Iterator[dict[str, Any]]:
    """Each worker scores the whole validation split, in file order (``verify``: its shards'
    checksums checked as they are read, where no driver checked them before)."""
    return store.iter_batches(job.dataset_dir, "validation", batch_size, verify=verify)
