"""Hashing for the IR's frozen dataclass nodes: a structural hash computed once per node (expressions
and index trees are keys of many memos; a frozen dataclass would rehash the whole tree at every lookup)."""

from __future__ import annotations


def _hash_once(self) -> int:
    h = self.__dict__.get("_hash")
    if h is None:
        h = hash((type(self).__name__, *(getattr(self, f) for f in self.__dataclass_fields__)))
        object.__setattr__(self, "_hash", h)
    return h


def _state(self) -> dict:
    """Pickled state without the cached hash (string hashes differ between processes)."""
    return {k: v for k, v in self.__dict__.items() if k != "_hash"}


def hash_once(*classes: type) -> None:
    """Give frozen dataclass node types a hash computed once per node."""
    for cls in classes:
        cls.__hash__ = _hash_once
        cls.__getstate__ = _state
