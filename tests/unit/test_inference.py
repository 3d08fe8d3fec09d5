"""The API's cache of loaded models (api/inference.py), in process."""

from __future__ import annotations

from api.inference import ModelCache


def test_model_cache_is_lru() -> None:
    cache = ModelCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now the most recent
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2
