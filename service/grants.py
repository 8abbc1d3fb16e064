"""Per-collection grants: which collections a tenant's calls may name.

A tenant's ``collections`` list in the tenants file holds exact collection names (``"docs"``)
and prefixes ending in ``*`` (``"team-a.*"`` matches ``team-a.notes``; ``"*"`` matches every
collection). A tenant without the list may use every collection. :class:`Grants` is the parsed
list; :data:`COLLECTION_FIELD` says where each RPC's request names its collection, so the
tenant interceptor can check the request grpc has already parsed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .collections import NAME_RE

#: The request field naming the collection, for every ``VectorIndex`` RPC that names one
#: (ListCollections names none: its answer is filtered instead).
COLLECTION_FIELD: dict[str, str] = {
    "Search": "collection", "Get": "collection", "Upsert": "collection", "UpsertStream": "collection",
    "Delete": "collection", "Flush": "collection", "Stats": "collection", "Count": "collection",
    "Scroll": "collection", "SetMetadata": "collection",
    "DescribeCollection": "name", "CreateCollection": "name", "DropCollection": "name",
}
#: A prefix pattern: the start of a collection name (or nothing), then ``*``.
PREFIX_RE = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.-]{0,62})?\*")


@dataclass(frozen=True)
class Grants:
    """Exact names and name prefixes; ``patterns`` is the list as written (for messages)."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    patterns: tuple[str, ...]

    @classmethod
    def everything(cls) -> "Grants":
        return cls(frozenset(), ("",), ("*",))

    @classmethod
    def parse(cls, patterns: list[str]) -> "Grants":
        """Grants from a ``collections`` list; raises ``ValueError`` whose message starts with
        the offending entry's index (``[2]: ...``) or ``: `` for the list as a whole."""
        if not patterns:
            raise ValueError(": expected at least one collection name or prefix ending in '*'; leave the field "
                             "out to allow every collection")
        seen: dict[str, int] = {}
        for i, p in enumerate(patterns):
            if not (NAME_RE.fullmatch(p) or PREFIX_RE.fullmatch(p)):
                raise ValueError(f"[{i}]: expected a collection name or a prefix ending in '*', got {p!r}")
            if p in seen:
                raise ValueError(f"[{i}]: {p!r} is also collections[{seen[p]}]")
            seen[p] = i
        return cls(frozenset(p for p in patterns if not p.endswith("*")),
                   tuple(p[:-1] for p in patterns if p.endswith("*")), tuple(patterns))

    @property
    def all(self) -> bool:
        return "" in self.prefixes

    def allows(self, name: str) -> bool:
        return name in self.names or name.startswith(self.prefixes)


def collection_named(rpc: str, request: Any) -> str | None:
    """The collection ``request`` (of ``rpc``) names, or None if the RPC names none or the
    request did not parse (the servicer refuses it)."""
    field = COLLECTION_FIELD.get(rpc)
    return None if field is None else getattr(request, field, None)
