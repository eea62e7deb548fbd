"""The streamed safetensors writer writes the bytes `safetensors.torch.save_file` writes, for the dtypes,
shapes (0-size and scalars included), names and metadata the suite saves; through the staging buffer (what
device tensors cross by, forced here on host tensors with a 7-byte buffer, so tensors span many chunks) as
straight from host memory; and refuses what save_file refuses."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from probepo import streamed_save
from probepo.streamed_save import HostStagingBuffer, save_streamed

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.uint8, torch.bool]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """A tensor of random bytes (bool: 0 or 1), of a random shape of up to 3 dims, 0-size ones included."""
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 5), max_size=3))
    numel = torch.Size(shape).numel()
    itemsize = torch.empty(0, dtype=dtype).element_size()
    raw = draw(st.binary(min_size=numel * itemsize, max_size=numel * itemsize))
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    if dtype == torch.bool:
        data = data % 2
    return data.view(dtype).reshape(shape)


names = st.text(max_size=12).filter(lambda name: name != "__metadata__")
state_dicts = st.dictionaries(names, tensors(), max_size=8)
one_key_metadata = st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=1)


def comparable(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> bool:
    """Not the one input save_file writes an unreadable file for: no tensors, empty metadata."""
    return bool(tensors) or metadata != {}


def both_files(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, **kwargs: Any
) -> tuple[bytes, bytes]:
    """(save_file's bytes, save_streamed's bytes) for the same inputs; nothing else left in the folder."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        save_file(tensors, folder / "reference.safetensors", metadata=metadata)
        save_streamed(tensors, folder / "streamed.safetensors", metadata=metadata, **kwargs)
        assert sorted(p.name for p in folder.iterdir()) == ["reference.safetensors", "streamed.safetensors"]
        return (folder / "reference.safetensors").read_bytes(), (folder / "streamed.safetensors").read_bytes()


@settings(max_examples=300)
@given(state_dicts, one_key_metadata)
def test_the_bytes_are_save_files(tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None) -> None:
    assume(comparable(tensors, metadata))
    reference, streamed = both_files(tensors, metadata)
    assert streamed == reference


@settings(max_examples=150)
@given(state_dicts, one_key_metadata, st.integers(1, 16))
def test_the_staging_buffer_writes_the_same_bytes(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None, capacity: int
) -> None:
    assume(comparable(tensors, metadata))
    staging = HostStagingBuffer(capacity, pin=False)
    with mock.patch.object(streamed_save, "_staged", lambda tensor: True):
        reference, streamed = both_files(tensors, metadata, staging=staging)
    assert streamed == reference
    largest = max((t.numel() * t.element_size() for t in tensors.values()), default=0)
    if largest:
        assert staging._buffer is not None and staging._buffer.numel() == min(largest, capacity)


def test_a_seven_byte_buffer_carries_tensors_over_many_chunks_and_is_kept() -> None:
    tensors = {"w": torch.randn(5, 3), "m": torch.randn(7, dtype=torch.float64), "s": torch.tensor(True)}
    staging = HostStagingBuffer(7, pin=False)
    with mock.patch.object(streamed_save, "_staged", lambda tensor: True):
        reference, streamed = both_files(tensors, {"format": "pt"}, staging=staging)
        kept = staging._buffer
        both_files({"x": torch.arange(40, dtype=torch.int32)}, None, staging=staging)
    assert streamed == reference
    assert kept is not None and kept.numel() == 7 and staging._buffer is kept


def test_several_metadata_keys_give_the_same_header_in_the_dicts_order() -> None:
    """save_file writes several metadata keys in a Rust HashMap's order (a process's random one): the
    files then differ only in that order."""
    tensors = {"b": torch.randn(2, 3), "a": torch.arange(4)}
    metadata = {"format": "pt", "step": "3", "note": "x"}
    reference, streamed = both_files(tensors, metadata)
    (size,) = struct.unpack("<Q", streamed[:8])
    assert len(streamed) == len(reference) and streamed[8 + size :] == reference[8 + size :]
    assert json.loads(streamed[8 : 8 + size]) == json.loads(reference[8 : 8 + size])
    assert list(json.loads(streamed[8 : 8 + size])["__metadata__"]) == list(metadata)


def test_no_tensors_and_empty_metadata_give_a_readable_file_where_save_files_is_not(tmp_path: Path) -> None:
    """safetensors declares a JSON map of 0 entries there, and serde_json closes it before the metadata."""
    reference, streamed = both_files({}, {})
    assert reference[8:].rstrip() == b'{},"__metadata__":{}}'
    assert streamed[8:].rstrip() == b'{"__metadata__":{}}'
    save_streamed({}, tmp_path / "empty.safetensors", metadata={})
    assert load_file(tmp_path / "empty.safetensors") == {}


def test_it_refuses_what_save_file_refuses_and_leaves_no_file(tmp_path: Path) -> None:
    base = torch.randn(4, 4)
    refused: list[tuple[dict[str, torch.Tensor], type[Exception]]] = [
        ({"t": base.T}, ValueError),  # not contiguous
        ({"a": base, "b": base[1]}, RuntimeError),  # shared memory
        ({"a": base, "b": base}, RuntimeError),
    ]
    for tensors, error in refused:
        with pytest.raises(error):
            save_file(tensors, tmp_path / "reference.safetensors")
        with pytest.raises(error):
            save_streamed(tensors, tmp_path / "streamed.safetensors")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_file_is_replaced_whole_and_a_loaded_one_stays_readable(tmp_path: Path) -> None:
    path = tmp_path / "state.safetensors"
    save_streamed({"x": torch.arange(1000, dtype=torch.int64)}, path)
    loaded = load_file(path)
    save_streamed({"x": torch.zeros(3)}, path)
    assert torch.equal(loaded["x"], torch.arange(1000, dtype=torch.int64))
    assert torch.equal(load_file(path)["x"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == ["state.safetensors"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_cross_a_pinned_buffer_into_the_same_bytes() -> None:  # pragma: no cover - GPU only
    on_device = {"w": torch.randn(1000, 3, device="cuda"), "b": torch.randn(5, device="cuda").bfloat16()}
    staging = HostStagingBuffer(1024)
    reference, streamed = both_files(on_device, {"format": "pt"}, staging=staging)
    assert streamed == reference
    assert staging._buffer is not None and staging._buffer.is_pinned() and staging._buffer.numel() == 1024


def test_save_pretrained_routed_through_the_writer_writes_the_same_files(tmp_path: Path) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(tmp_path / "library")
    writer = mock.Mock(wraps=save_streamed)
    with mock.patch.object(streamed_save, "save_streamed", writer), streamed_save.streamed_pretrained_saves():
        model.save_pretrained(tmp_path / "streamed")
    assert writer.call_count == 1  # the weights went through the writer, not the library's
    import transformers.modeling_utils as modeling

    assert modeling.safe_save_file is save_file  # the library's writer back after the block
    written = sorted(p.name for p in (tmp_path / "library").iterdir())
    assert "model.safetensors" in written and written == sorted(
        p.name for p in (tmp_path / "streamed").iterdir()
    )
    for name in written:
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "library" / name).read_bytes(), name
