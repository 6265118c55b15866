"""The dataset schema: one Parquet row per task. This module is the single place it is defined.

Bandit rows (A arms, context length H):

| column          | dtype   | shape | meaning                                               |
|-----------------|---------|-------|-------------------------------------------------------|
| task_id         | int64   |       | index of the task within its split                    |
| means           | float32 | [A]   | arm means mu_a ~ U[0, 1]                               |
| behaviour_probs | float32 | [A]   | propensities p of the context policy (sum to 1)       |
| favoured_arm    | uint8   |       | i*, the arm the behaviour mixture favours             |
| actions         | uint8   | [H]   | context actions a_1..a_H ~ p                          |
| rewards         | float32 | [H]   | context rewards r_t ~ N(mu_{a_t}, sigma^2)            |
| optimal_action  | uint8   |       | argmax_a mu_a                                          |
| label           | uint8   |       | training label a* under the dataset's label rule      |

Darkroom rows (context length H); the behaviour policy is uniform (pi_b = 1/5), so no
propensities are stored:

| column          | dtype   | shape    | meaning                                              |
|-----------------|---------|----------|------------------------------------------------------|
| task_id         | int64   |          | index of the task within its split                   |
| goal            | uint8   | [2]      | goal cell (x, y)                                     |
| states          | uint8   | [H+1, 2] | s_1..s_{H+1} (states[0] is the start); see below     |
| actions         | uint8   | [H]      | uniform-random context actions                       |
| rewards         | uint8   | [H]      | 1 iff s_{t+1} == goal                                |
| query_state     | uint8   | [2]      | query state s_qry (uniform over the grid)            |
| optimal_action  | uint8   |          | shortest-path action at s_qry                        |
| label           | uint8   |          | training label a* under the dataset's label rule      |

Transition t of a darkroom context is (states[t], actions[t], rewards[t], states[t+1]), so
s'_t == s_{t+1} holds by construction.

Tensor columns use pyarrow's canonical ``arrow.fixed_shape_tensor`` extension type, which reads
back without Ray (``to_numpy_ndarray()``) and streams through Ray Data's ``iter_torch_batches``.
Bump SCHEMA_VERSION whenever a column changes: manifests record it and refuse a mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    """One column: numpy dtype and per-row shape (() for scalars)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


def columns(env_name: str, num_arms: int, horizon: int) -> tuple[Column, ...]:
    """The columns of a dataset of ``env_name`` in storage order."""
    u8, f32 = np.dtype(np.uint8), np.dtype(np.float32)
    if env_name == "bandit":
        return (
            Column("task_id", np.dtype(np.int64), ()),
            Column("means", f32, (num_arms,)),
            Column("behaviour_probs", f32, (num_arms,)),
            Column("favoured_arm", u8, ()),
            Column("actions", u8, (horizon,)),
            Column("rewards", f32, (horizon,)),
            Column("optimal_action", u8, ()),
            Column("label", u8, ()),
        )
    if env_name == "darkroom":
        return (
            Column("task_id", np.dtype(np.int64), ()),
            Column("goal", u8, (2,)),
            Column("states", u8, (horizon + 1, 2)),
            Column("actions", u8, (horizon,)),
            Column("rewards", u8, (horizon,)),
            Column("query_state", u8, (2,)),
            Column("optimal_action", u8, ()),
            Column("label", u8, ()),
        )
    raise ValueError(f"env.name={env_name!r} is invalid: one of bandit, darkroom")


def arrow_schema(cols: tuple[Column, ...]) -> pa.Schema:
    """pyarrow schema with fixed-shape tensor extension types for array columns."""
    fields = []
    for c in cols:
        value_type = pa.from_numpy_dtype(c.dtype)
        if c.shape:
            fields.append(pa.field(c.name, pa.fixed_shape_tensor(value_type, list(c.shape))))
        else:
            fields.append(pa.field(c.name, value_type))
    return pa.schema(fields)


def to_table(cols: tuple[Column, ...], arrays: dict[str, np.ndarray]) -> pa.Table:
    """Pack numpy columns [N, *shape] into an Arrow table of :func:`arrow_schema`."""
    out = []
    for c in cols:
        a = np.ascontiguousarray(arrays[c.name], dtype=c.dtype)
        expected = (a.shape[0], *c.shape)
        if a.shape != expected:
            raise ValueError(f"column {c.name}: shape {a.shape}, expected {expected}")
        if c.shape and len(a) == 0:  # from_numpy_ndarray refuses empty arrays
            ext = pa.fixed_shape_tensor(pa.from_numpy_dtype(c.dtype), list(c.shape))
            out.append(pa.ExtensionArray.from_storage(ext, pa.array([], ext.storage_type)))
        elif c.shape:
            out.append(pa.FixedShapeTensorArray.from_numpy_ndarray(a))
        else:
            out.append(pa.array(a))
    return pa.Table.from_arrays(out, schema=arrow_schema(cols))


def column_to_numpy(col: pa.ChunkedArray | pa.Array, spec: Column) -> np.ndarray:
    """Decode one Arrow column (tensor extension, fixed-size list or scalar) to [N, *shape]."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if not spec.shape:
        return col.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False)
    if isinstance(col.type, pa.FixedShapeTensorType):
        return col.to_numpy_ndarray().astype(spec.dtype, copy=False)
    flat = col.flatten()
    while pa.types.is_fixed_size_list(flat.type):
        flat = flat.flatten()
    return flat.to_numpy(zero_copy_only=False).astype(spec.dtype, copy=False).reshape(
        (len(col), *spec.shape)
    )


def from_table(cols: tuple[Column, ...], table: pa.Table) -> dict[str, np.ndarray]:
    """Decode an Arrow table of this schema into numpy columns."""
    missing = [c.name for c in cols if c.name not in table.column_names]
    if missing:
        raise ValueError(f"table lacks columns {missing}; has {table.column_names}")
    return {c.name: column_to_numpy(table.column(c.name), c) for c in cols}


def raw_nbytes(cols: tuple[Column, ...]) -> int:
    """Bytes of one task's raw numpy arrays (the disk-size baseline)."""
    return sum(int(np.prod(c.shape, dtype=np.int64)) * c.dtype.itemsize for c in cols)
