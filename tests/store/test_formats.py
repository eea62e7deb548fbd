"""Safe formats: round trips, list<int32> token ids, and clear errors on corrupt input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from probepo.store import FormatError
from probepo.store.formats import (
    from_json_bytes,
    table_from_parquet,
    table_to_parquet,
    tensors_from_bytes,
    tensors_to_bytes,
    to_json_bytes,
)


def test_tensors_round_trip_dtypes_and_views() -> None:
    tensors = {
        "logp": torch.randn(4, 7),
        "mask": torch.rand(4, 7) > 0.5,
        "ids": torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),  # non-contiguous
        "bf16": torch.ones(3, dtype=torch.bfloat16),
    }
    back = tensors_from_bytes(tensors_to_bytes(tensors))
    assert set(back) == set(tensors)
    for name, tensor in tensors.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)


def test_corrupt_safetensors_raise_format_error() -> None:
    data = tensors_to_bytes({"x": torch.zeros(10)})
    with pytest.raises(FormatError, match="safetensors"):
        tensors_from_bytes(data[:20])


def test_table_round_trip_with_token_id_lists_and_arrays() -> None:
    columns = {
        "token_ids": [[1, 2, 3], [], [151_643, 7]],
        "reward": np.array([1.0, 0.0, 0.5], dtype=np.float32),
        "text": ["a", "bé", ""],
        "pivots": np.array([[0, 4], [2, -1], [-1, -1]], dtype=np.int64),
        "finish": ["stop", "length", None],
    }
    data = table_to_parquet(columns)
    schema = pq.read_schema(pa.BufferReader(data))
    assert schema.field("token_ids").type == pa.list_(pa.int32())
    back = table_from_parquet(data)
    assert back["token_ids"] == [[1, 2, 3], [], [151_643, 7]]
    assert back["reward"].dtype == np.float32 and np.array_equal(back["reward"], columns["reward"])
    assert back["text"] == ["a", "bé", ""]
    assert back["pivots"].shape == (3, 2) and np.array_equal(back["pivots"], columns["pivots"])
    assert back["finish"] == ["stop", "length", None]


def test_large_ints_stay_int64() -> None:
    data = table_to_parquet({"ids": [[2**40]]})
    assert pq.read_schema(pa.BufferReader(data)).field("ids").type == pa.list_(pa.int64())


def test_corrupt_parquet_and_bad_columns_raise_format_error() -> None:
    data = table_to_parquet({"x": [1, 2, 3]})
    with pytest.raises(FormatError, match="Parquet"):
        table_from_parquet(data[: len(data) // 2])
    with pytest.raises(FormatError, match="columns"):
        table_to_parquet({"a": [1, 2], "b": [1]})


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6), max_size=8))
def test_token_id_lists_round_trip(rows: list[list[int]]) -> None:
    assert table_from_parquet(table_to_parquet({"ids": rows}))["ids"] == rows


def test_json_is_canonical_and_accepts_numpy_scalars() -> None:
    first = to_json_bytes({"b": 1, "a": [np.float32(0.5), np.int64(3)], "c": float("nan")})
    assert first.startswith(b'{"a":[0.5,3],"b":1,"c":NaN}')
    assert to_json_bytes({"a": [0.5, 3], "b": 1}) == to_json_bytes({"b": 1, "a": [0.5, 3]})
    assert from_json_bytes(to_json_bytes({"é": "ü"})) == {"é": "ü"}
    with pytest.raises(FormatError, match="JSON"):
        from_json_bytes(b'{"truncated": ')
    with pytest.raises(FormatError, match="JSON"):
        to_json_bytes({"x": object()})
