"""The in-memory engine state and the one place that changes it.

Every change to the id map, version map, heads and graph is described by an operation-log
record (see ``oplog``) that is committed to the store together with the posting changes it
goes with; ``State.apply`` then makes it effective. Replaying the records written after the
last checkpoint through the same ``apply`` rebuilds the state after a restart.

A record is a bundle of optional sections (array names share a prefix):

* ``g_``: heads ``g_pids`` get ``g_vectors``, liveness ``g_alive`` and radius ``g_radius``;
  graph rows ``g_rows`` become ``g_row_values``; entry points become ``g_entries``;
* ``u_``: upsert of ids ``u_exts`` as vids ``u_vids`` with versions ``u_versions`` and home
  postings ``u_home``; vids >= ``meta["first_new_vid"]`` are new; ``u_retired`` vids retire;
* ``d_``: delete of live vids ``d_vids``;
* ``m_``: live copies of ``m_vids`` moved from posting ``m_from`` to ``m_to``;
* ``r_``: reassignment: ``r_vids`` got copies in new postings, the first is ``r_home``;
* ``gc_``: postings ``gc_pids`` were rewritten without garbage;
* ``s_``: string ids ``s_data``/``s_offsets`` (utf-8, offsets) get the internal ids from
  ``meta["first_str"]`` on (before the ``u_`` section that uses them);
* ``u_meta``/``u_meta_off``: the metadata (compact JSON, offsets; an empty slice is none) of
  the ``u_`` rows, present once the index has metadata; ``p_vids`` get metadata
  ``p_meta``/``p_meta_off`` (``set_metadata``).

``meta["id_type"]`` ("int" or "str") fixes the kind of ids with the first write, and
``meta["payload"]`` marks the index as holding metadata or documents from then on.
"""
from __future__ import annotations

import numpy as np

from . import payloads, strids
from .errors import CorruptionError
from .filters import PayloadIndex, decode_metadata
from .heads import HeadGraph
from .idmap import DELETED, IdMap
from .oplog import Record

ID_TYPES = (None, "int", "str")


class State:
    """Id map, heads and graph, per-posting garbage counts, and the record-level tables:
    string ids and the payload index of metadata (for filters)."""

    def __init__(self, idmap: IdMap, graph: HeadGraph, garbage: np.ndarray | None = None,
                 arrays: dict[str, np.ndarray] | None = None):
        """``arrays``: a checkpoint's, for the string ids, id type and payload index."""
        self.idmap = idmap
        self.graph = graph
        self.garbage = np.zeros(max(graph.capacity, 16), dtype=np.int32)
        if garbage is not None:
            self.garbage[: garbage.shape[0]] = garbage
        arrays = arrays or {}
        self.strids = strids.StrIds.from_arrays(arrays)
        self.id_type: str | None = ID_TYPES[int(arrays["id_type"][0])] if "id_type" in arrays else None
        self.has_payload = bool(arrays["has_payload"][0]) if "has_payload" in arrays else False
        has_index = any(k.startswith("pl_") for k in arrays)
        self.payload = PayloadIndex.from_arrays(arrays) if has_index else PayloadIndex()
        self.applied = 0  # records applied: what a cached filter plan was made at

    def arrays(self) -> dict[str, np.ndarray]:
        out = {**self.idmap.arrays(), **self.graph.arrays(), "garbage": self.garbage[: self.graph.n],
               "id_type": np.array([ID_TYPES.index(self.id_type)], dtype=np.uint8),
               "has_payload": np.array([self.has_payload])}
        if self.id_type == "str":
            out.update(self.strids.arrays())
        if self.has_payload:
            out.update(self.payload.arrays())
        return out

    def _count_garbage(self, vids: np.ndarray) -> None:
        """The live copies of ``vids`` (in their homes) are about to become garbage."""
        idm = self.idmap
        live = vids[(idm.versions[vids] & DELETED) == 0]
        homes = idm.home[live]
        homes = homes[homes >= 0]
        if homes.size:
            self._reserve_garbage(int(homes.max()) + 1)
            np.add.at(self.garbage, homes, 1)

    def _reserve_garbage(self, n: int) -> None:
        if n > self.garbage.shape[0]:
            grown = np.zeros(max(n, 2 * self.garbage.shape[0]), dtype=np.int32)
            grown[: self.garbage.shape[0]] = self.garbage
            self.garbage = grown

    def apply(self, rec: Record, *, graph_done: bool = False) -> None:
        """Make a committed record effective. ``graph_done``: the caller already changed the
        graph in memory (the live rebalancing path); replay passes False."""
        self.applied += 1
        a = rec.arrays
        idm = self.idmap
        if "g_pids" in a and not graph_done:
            self.graph.set_state(a["g_pids"], a["g_vectors"], a["g_alive"], a["g_rows"],
                                 a["g_row_values"], a["g_entries"], a.get("g_radius"))
        self._reserve_garbage(self.graph.capacity)
        if "id_type" in rec.meta:
            self.id_type = rec.meta["id_type"]
        if rec.meta.get("payload"):
            self.has_payload = True
        if "s_offsets" in a:
            self.strids.register(strids.decode(a["s_data"], a["s_offsets"]), int(rec.meta["first_str"]))
        if "u_vids" in a:
            vids = a["u_vids"].astype(np.int64)
            first_new = int(rec.meta["first_new_vid"])
            if "u_retired" in a and a["u_retired"].size:
                retired = a["u_retired"].astype(np.int64)
                self._count_garbage(retired)
                idm.retire(retired)
            new = vids >= first_new
            old = vids[~new]
            self._count_garbage(old)
            if new.any():
                if idm.n_vids != first_new:
                    raise CorruptionError(
                        f"operation log out of step: next vid is {idm.n_vids}, record says {first_new}")
                idm.allocate(np.ascontiguousarray(a["u_exts"][new], dtype=np.int64))
            idm.set_versions(old, a["u_versions"][~new])
            idm.home[vids] = a["u_home"]
            if "u_meta_off" in a:
                self._set_metadata(vids, rec, "u_meta")
        if "d_vids" in a:
            vids = a["d_vids"].astype(np.int64)
            self._count_garbage(vids)
            idm.delete(vids)
        if "m_vids" in a:
            vids = a["m_vids"].astype(np.int64)
            stay = idm.home[vids] == a["m_from"]
            idm.home[vids[stay]] = a["m_to"][stay]
        if "r_vids" in a:
            idm.home[a["r_vids"].astype(np.int64)] = a["r_home"]
        if "gc_pids" in a:
            self.garbage[a["gc_pids"].astype(np.int64)] = 0
        if "p_vids" in a:
            self._set_metadata(a["p_vids"].astype(np.int64), rec, "p_meta")

    def _set_metadata(self, vids: np.ndarray, rec: Record, name: str) -> None:
        """Index the metadata of ``rec``'s array ``name`` (with its ``_off``sets) as ``vids``'s:
        as the writer handed it over (``payloads.Metadata``), or decoded (replay)."""
        given = rec.decoded.get(name)
        if given is not None:
            given.index(self.payload, vids)
            return
        data = payloads.unpack(rec.arrays[name], rec.arrays[name + "_off"])
        self.payload.set(vids, [None if b is None else decode_metadata(b) for b in data])
