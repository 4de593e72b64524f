"""What the public API accepts for a store and a config: what a user types, or the loaded objects.

A notebook passes `"s3://bucket/prefix"` or `"./kcompact-store"` and `"conf/kcompact.yaml"`; a job that already
opened them passes an `ObjectStore` / `StoreSpec` and a `KcompactConfig`. Anything else is a `TypeError` naming
what was expected, not an `AttributeError` three calls down.
"""

from __future__ import annotations

from os import PathLike

from compaction.config import KcompactConfig, load_config
from compaction.storage.base import ObjectStore, StoreSpec, open_store


def as_store(store: object) -> ObjectStore:
    """An open store from a store URI or path, a `StoreSpec` or an `ObjectStore` (returned as is)."""
    if isinstance(store, ObjectStore):
        return store
    if isinstance(store, StoreSpec):
        return store.open()
    if isinstance(store, str | PathLike):
        return open_store(str(store))
    raise TypeError(f"store: expected a store URI or path (str), a StoreSpec or an ObjectStore, found "
                    f"{type(store).__name__}")


def as_config(config: object) -> KcompactConfig:
    """A config from a YAML path or a `KcompactConfig` (returned as is)."""
    if isinstance(config, KcompactConfig):
        return config
    if isinstance(config, str | PathLike):
        return load_config(str(config))
    raise TypeError(f"config: expected a config file path (str) or a KcompactConfig, found {type(config).__name__}")


__all__ = ["as_config", "as_store"]
