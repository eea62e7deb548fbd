"""Safe serialisation for everything read back from the store: safetensors, Parquet, canonical JSON.

Nothing here can execute code while loading (no pickle). Decoding errors raise FormatError naming the
format and what failed.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from os import PathLike
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from probepo.store.errors import FormatError

_INT32 = np.iinfo(np.int32)


# -- tensors (safetensors) -----------------------------------------------------------------------------


def tensors_to_bytes(tensors: Mapping[str, Any]) -> bytes:
    """Serialise a dict of torch tensors as safetensors (contiguous copies are made where needed)."""
    from safetensors.torch import save

    try:
        return save({name: tensor.contiguous() for name, tensor in tensors.items()})
    except Exception as exc:
        raise FormatError(f"cannot encode tensors as safetensors: {exc}") from exc


def tensors_from_bytes(data: bytes) -> dict[str, Any]:
    """Load a dict of torch tensors from safetensors bytes."""
    from safetensors.torch import load

    try:
        return load(bytes(data))
    except Exception as exc:
        raise FormatError(f"cannot decode safetensors ({len(data)} bytes): {exc}") from exc


# -- tables (Parquet) ----------------------------------------------------------------------------------


def _column(name: str, values: Any) -> pa.Array:
    """One Arrow column: 1-D arrays stay typed, 2-D arrays become fixed-size lists, lists of int lists become
    list<int32> (token ids) unless a value does not fit in 32 bits."""
    if isinstance(values, np.ndarray):
        if values.ndim == 1:
            return pa.array(values)
        if values.ndim == 2:
            flat = pa.array(np.ascontiguousarray(values).reshape(-1))
            return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])
        raise FormatError(f"column {name!r}: arrays of {values.ndim} dimensions are not supported (1 or 2)")
    rows = list(values)
    present = [row for row in rows if row is not None]
    if (
        present
        and all(isinstance(row, list | tuple | np.ndarray) for row in present)
        and _int32_rows(present)
    ):
        return pa.array(
            [None if row is None else [int(x) for x in row] for row in rows], pa.list_(pa.int32())
        )
    return pa.array([row.tolist() if isinstance(row, np.ndarray) else row for row in rows])


def _int32_rows(rows: Sequence[Any]) -> bool:
    """Whether every item of every row is an integer (not a bool) that fits in 32 bits."""
    return all(
        isinstance(x, int | np.integer) and not isinstance(x, bool) and _INT32.min <= x <= _INT32.max
        for row in rows
        for x in row
    )


def table_to_parquet(columns: Mapping[str, Any]) -> bytes:
    """Serialise equal-length columns (lists, 1-D/2-D numpy arrays, lists of lists) as Parquet bytes."""
    try:
        table = pa.table({name: _column(name, values) for name, values in columns.items()})
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise FormatError(f"cannot build a table from columns {sorted(columns)}: {exc}") from exc
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue()


def _decode(column: pa.ChunkedArray) -> list | np.ndarray:
    """Numeric columns without nulls come back as numpy arrays (2-D for fixed-size lists); others as lists."""
    kind = column.type
    if column.null_count == 0:
        if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
            return column.to_numpy()
        if pa.types.is_fixed_size_list(kind):
            inner = column.combine_chunks()
            if inner.values.null_count == 0 and not pa.types.is_nested(kind.value_type):
                flat = inner.values.slice(inner.offset * kind.list_size, len(inner) * kind.list_size)
                return flat.to_numpy(zero_copy_only=False).reshape(len(inner), kind.list_size)
    return column.to_pylist()


def table_from_parquet(data: bytes) -> dict[str, list | np.ndarray]:
    """Load Parquet bytes as {column: numpy array or list} (see `_decode` for which is which)."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"cannot decode Parquet ({len(data)} bytes): {exc}") from exc
    return {name: _decode(table.column(name)) for name in table.column_names}


# -- metadata (JSON) -----------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """numpy/torch scalars and arrays become plain numbers and lists; paths become strings."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, PathLike):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


def to_json_bytes(obj: Any) -> bytes:
    """Canonical JSON: sorted keys, compact, UTF-8. NaN/Infinity are kept (as Python writes them) so that a
    diverging run's metrics survive; everything else is strict JSON."""
    try:
        return json.dumps(
            obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_jsonable
        ).encode()
    except (TypeError, ValueError) as exc:
        raise FormatError(f"cannot encode as JSON: {exc}") from exc


def from_json_bytes(data: bytes) -> Any:
    """Parse JSON bytes (UTF-8)."""
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"cannot decode JSON ({len(data)} bytes): {exc}") from exc


def format_bytes(count: float) -> str:
    """A size as people read it: 512.0 B, 1.5 KiB, ... 9.8 TiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"
