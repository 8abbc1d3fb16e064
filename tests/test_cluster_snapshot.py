"""A snapshot of an open index (what a replica ships to a peer that lost its disk) reopens
as the index was, and the pieces it travels in put it back together byte for byte."""
from __future__ import annotations

import os
import threading

import numpy as np
import pytest

pytest.importorskip("ray")

import vindex  # noqa: E402
from vindex.cluster import snapshot  # noqa: E402


def test_snapshot_of_an_index_being_written_reopens_consistent(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 8)).astype(np.float32)
    with vindex.Index.create(tmp_path / "src", dim=8, checkpoint_every=500) as index:
        index.upsert(np.arange(2000), x[:2000], metadata=[{"i": i} for i in range(2000)])
        index.checkpoint()
        index.delete(np.arange(10))
        writing = threading.Thread(target=lambda: [index.upsert(np.arange(lo, lo + 100), x[lo:lo + 100])
                                                   for lo in range(2000, 4000, 100)])
        writing.start()
        snapshot.take(index, str(tmp_path / "snap"))  # while the writer commits
        writing.join()
    with vindex.Index.open(tmp_path / "snap") as copy:
        n = len(copy)
        assert 1990 <= n <= 3990 and (n - 1990) % 100 == 0  # whole writes only
        got = copy.get(np.arange(n + 10))
        assert not got.found[:10].any() and got.found[10:n + 10].all()
        np.testing.assert_array_equal(got.vectors[10:n + 10], x[10:n + 10])
        assert copy.get([5, 50], include=["metadata"]).metadata == [None, {"i": 50}]


def test_pieces_rebuild_the_files(tmp_path):
    src, dst = tmp_path / "a", tmp_path / "b"
    (src / "d").mkdir(parents=True)
    data = os.urandom(3 * 1000 + 7)
    (src / "d" / "f").write_bytes(data)
    (src / "empty").write_bytes(b"")
    snapshot.fetch(snapshot.files(str(src)), lambda rel, offset: snapshot.read_piece(str(src), rel, offset, 1000),
                   str(dst))
    assert (dst / "d" / "f").read_bytes() == data and (dst / "empty").read_bytes() == b""


def test_other_stores_refuse(tmp_path):
    with vindex.Index.create(tmp_path / "m", dim=4, store="memory") as index:
        with pytest.raises(snapshot.SnapshotUnsupportedError, match="memory"):
            snapshot.take(index, str(tmp_path / "snap"))
