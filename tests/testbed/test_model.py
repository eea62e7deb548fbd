"""The tiny GPT: checkpoint round-trip, KV-cache decoding equals the full forward, padding invariance."""

import pytest
import torch
from pydantic import ValidationError

from probepo.config import ModelConfig
from probepo.models import GPT, load_model, save_model

CONFIG = ModelConfig(vocab_size=19, d_model=32, n_layers=2, n_heads=4, context=48)


def make_model(seed=0):
    torch.manual_seed(seed)
    return GPT(CONFIG)


def test_default_model_is_about_100k_parameters():
    assert 80_000 < sum(p.numel() for p in GPT(ModelConfig()).parameters()) < 130_000


def test_save_load_round_trip(tmp_path):
    model = make_model()
    save_model(model, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors"]
    loaded = load_model(tmp_path / "ckpt")
    ids = torch.randint(0, 19, (3, 20))
    assert loaded.config == CONFIG
    assert torch.equal(model(ids), loaded(ids))


def test_incremental_decoding_matches_full_forward():
    model = make_model()
    ids = torch.randint(0, 19, (4, 30))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(4, 30)
        pieces = [model(ids[:, :10], cache=cache)] + [
            model(ids[:, t : t + 1], cache=cache) for t in range(10, 30)
        ]
    assert cache.length == 30
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_left_padded_rows_compute_what_they_would_alone():
    model = make_model()
    short, long = torch.randint(0, 19, (1, 7)), torch.randint(0, 19, (1, 12))
    ids = torch.cat([torch.cat([torch.zeros(1, 5, dtype=torch.long), short], 1), long])
    pad = torch.tensor([5, 0])
    positions = (torch.arange(12)[None] - pad[:, None]).clamp(min=0)
    valid = torch.arange(14)[None] >= pad[:, None]
    with torch.no_grad():
        cache = model.new_cache(2, 14)
        padded = model(ids, positions, valid, cache)
        nxt = torch.tensor([[3], [4]])
        step = model(nxt, torch.tensor([[7], [12]]), valid, cache)
        alone = model(torch.cat([short, nxt[:1]], 1))
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded[0, 5:], alone[0, :7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[0, 0], alone[0, 7], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(padded[1], model(long)[0], rtol=1e-5, atol=1e-5)


def test_cache_fork_repeats_rows():
    model = make_model()
    ids = torch.randint(0, 19, (2, 5))
    with torch.no_grad():
        cache = model.new_cache(2, 8)
        model(ids, cache=cache)
        forked = cache.expand(3)
        out = model(torch.full((6, 1), 4), cache=forked)
    assert forked.length == 6 and forked.keys.shape[1] == 6
    torch.testing.assert_close(out[0], out[2])
    torch.testing.assert_close(out[3], out[5])


def test_context_and_config_limits():
    model = make_model()
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 49, dtype=torch.long))
    with pytest.raises(ValidationError, match="n_heads"):
        ModelConfig(d_model=30, n_heads=4)
    with pytest.raises(ValidationError, match="d_model"):
        ModelConfig(d_model=4)
