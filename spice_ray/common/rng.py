"""Counter-based random numbers keyed per task.

Dataset generation and evaluation need randomness that depends only on (seed, split, task id,
stream, step), never on how tasks are batched over actors or shards. A per-task
``numpy.random.Generator`` would give that but forces a Python loop over tasks. Instead each task
gets a 64-bit key derived from a ``numpy.random.SeedSequence``, and a draw is a strong 64-bit mix
(the SplitMix64 finaliser, applied twice) of (key, stream, counter) -- the same idea as the
Philox/Threefry counter-based generators of JAX and numpy, vectorised over tasks and steps.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

SPLITS = ("train", "validation", "eval")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_TWO_POW_53 = float(2**53)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a bijective avalanche mix of uint64 values."""
    z = z ^ (z >> np.uint64(30))
    z = z * _M1
    z = z ^ (z >> np.uint64(27))
    z = z * _M2
    return z ^ (z >> np.uint64(31))


def _stream_id(stream: str) -> np.uint64:
    digest = hashlib.blake2b(stream.encode(), digest_size=8).digest()
    return np.uint64(int.from_bytes(digest, "little"))


def split_key(seed: int, split: str) -> int:
    """64-bit root key of one split of one dataset seed."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is invalid: one of {SPLITS}")
    state = np.random.SeedSequence([seed, SPLITS.index(split)]).generate_state(2, np.uint64)
    return int(state[0] ^ (state[1] << np.uint64(1)))


@dataclass(frozen=True)
class TaskStreams:
    """Independent random streams for a batch of tasks.

    Attributes:
        keys: uint64 [B], one key per task.
    """

    keys: np.ndarray

    @classmethod
    def from_seed(cls, seed: int, split: str, task_ids: np.ndarray) -> TaskStreams:
        """Keys for ``task_ids`` of ``split``: a function of (seed, split, task_id) only."""
        root = np.uint64(split_key(seed, split))
        ids = np.asarray(task_ids, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return cls(_mix(_mix(root ^ (ids * _GOLDEN)) + _GOLDEN))

    @classmethod
    def from_generator(cls, rng: np.random.Generator, num_tasks: int) -> TaskStreams:
        """Fresh keys drawn from a numpy Generator (for ad-hoc use outside datasets)."""
        return cls(rng.integers(0, 2**63, size=num_tasks, dtype=np.uint64))

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def subset(self, index: np.ndarray | slice) -> TaskStreams:
        """Streams of a subset of tasks (same keys, so the same draws)."""
        return TaskStreams(self.keys[index])

    def bits(self, stream: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Raw uint64 draws [B, *shape]; element i of the trailing axes uses counter i."""
        n = int(np.prod(shape)) if shape else 1
        counters = np.arange(n, dtype=np.uint64)
        with np.errstate(over="ignore"):
            base = _mix(self.keys ^ _stream_id(stream))
            out = _mix(_mix(base[:, None] + counters[None, :] * _GOLDEN) ^ base[:, None])
        return out.reshape((len(self), *shape))

    def uniform(self, stream: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Uniform float64 in [0, 1), [B, *shape]."""
        return (self.bits(stream, shape) >> np.uint64(11)).astype(np.float64) / _TWO_POW_53

    def uniform_open(self, stream: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Uniform float64 in (0, 1], [B, *shape] (safe under log)."""
        return 1.0 - self.uniform(stream, shape)

    def normal(self, stream: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Standard normal float64 [B, *shape] (Box-Muller on two sub-streams)."""
        u1 = self.uniform_open(stream + "/r", shape)
        u2 = self.uniform(stream + "/theta", shape)
        return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def exponential(self, stream: str, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Exponential(1) float64 [B, *shape]."""
        return -np.log(self.uniform_open(stream, shape))

    def integers(self, stream: str, high: int, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Uniform integers in [0, high), int64 [B, *shape]."""
        u = self.uniform(stream, shape)
        return np.minimum((u * high).astype(np.int64), high - 1)

    def categorical(self, stream: str, probs: np.ndarray, num: int) -> np.ndarray:
        """``num`` i.i.d. draws per task from per-task probabilities.

        Args:
            probs: [B, A] rows summing to 1.
            num: draws per task.

        Returns:
            int64 [B, num] in [0, A).
        """
        cdf = np.cumsum(probs, axis=-1)  # (B, A)
        u = self.uniform(stream, (num,)) * cdf[:, -1:]  # (B, num), scaled for rounding
        draws = np.empty(u.shape, dtype=np.int64)
        for b in range(0, len(self), 4096):  # bounded memory: (chunk, num, A) booleans
            sl = slice(b, b + 4096)
            draws[sl] = (u[sl, :, None] >= cdf[sl, None, :]).sum(-1)
        return np.minimum(draws, probs.shape[-1] - 1)


class StepDraws:
    """Draws for an agent that acts step by step on a batch of tasks.

    The n-th request gives each task draws that are a function of (its key, ``stream``, n) only,
    so a task's draws do not depend on which other tasks share the batch: an evaluation sharded
    over any number of actors takes the same random actions. Every task of the batch must take
    part in every request (agents act on all their tasks at every step).

    Args:
        streams: the batch's task keys, e.g. ``TaskStreams.from_seed(seed, "eval", task_ids)``.
        stream: a name that separates these draws from the task's other streams.
    """

    def __init__(self, streams: TaskStreams, stream: str) -> None:
        self.streams = streams
        self.stream = stream
        self.requests = 0
        self.tie_requests = 0

    def __len__(self) -> int:
        return len(self.streams)

    def _next(self) -> str:
        name = f"{self.stream}/{self.requests}"
        self.requests += 1
        return name

    def ties(self) -> np.ndarray:
        """Uniforms float64 [B] in [0, 1) that break the next argmax's ties. A stream and a
        counter of their own: an agent that breaks ties draws the same Thompson noise or policy
        samples as one that does not."""
        name = f"{self.stream}/ties/{self.tie_requests}"
        self.tie_requests += 1
        return self.streams.uniform(name)

    def normal(self, shape: tuple[int, ...] = ()) -> np.ndarray:
        """Standard normals float64 [B, *shape] for the next request."""
        return self.streams.normal(self._next(), shape)

    def categorical(self, probs: np.ndarray) -> np.ndarray:
        """One draw per task from probabilities [B, A] (:meth:`TaskStreams.categorical`), int64
        [B], for the next request."""
        return self.streams.categorical(self._next(), probs, 1)[:, 0]
