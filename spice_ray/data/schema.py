"""The dataset format: one Parquet row per task, columns as the environment declares them.

Each environment lists its columns (``Environment.columns()``: name, dtype, per-row shape,
``task_id`` first) and documents what they mean in its own module; this module packs and
unpacks them. Tensor columns use pyarrow's canonical ``arrow.fixed_shape_tensor`` extension
type, which reads back without Ray (``to_numpy_ndarray()``) and streams through Ray Data's
``iter_torch_batches``. Bump SCHEMA_VERSION whenever the format changes: manifests record it
and refuse a mismatch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from spice_ray.envs.base import Column

SCHEMA_VERSION = 1


def columns(env: Any) -> tuple[Column, ...]:
    """The columns of a dataset of ``env`` (an EnvConfig or an Environment), storage order."""
    return (env.environment() if hasattr(env, "environment") else env).columns()


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
