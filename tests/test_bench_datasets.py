"""Fast tests for bench/: readers, data-set loading, ground truth, recall, synthetic data, a peer."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

from bench import datasets, measure, synthetic
from bench.datasets import (
    ground_truth,
    load,
    read_bin,
    read_bvecs,
    read_fvecs,
    read_hdf5,
    read_ivecs,
    read_npy,
    read_vectors,
    recall_at_k,
)

RNG = np.random.default_rng(7)


# --- readers ----------------------------------------------------------------------------------


def _write_xvecs(path, arr: np.ndarray) -> None:
    n, d = arr.shape
    with open(path, "wb") as f:
        for row in arr:
            np.array([d], dtype="<i4").tofile(f)
            row.tofile(f)


def _write_bin(path, arr: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.array(arr.shape, dtype="<i4").tofile(f)
        arr.tofile(f)


@pytest.mark.parametrize(
    "suffix, reader, dtype",
    [(".fvecs", read_fvecs, np.float32), (".ivecs", read_ivecs, np.int32), (".bvecs", read_bvecs, np.uint8)],
)
def test_xvecs_round_trip(tmp_path, suffix, reader, dtype):
    arr = (RNG.random((37, 5)) * 200).astype(dtype)
    path = tmp_path / f"x{suffix}"
    _write_xvecs(path, arr)
    for got in (reader(path), read_vectors(path)):
        assert got.dtype == dtype and got.shape == arr.shape
        np.testing.assert_array_equal(got, arr)
    np.testing.assert_array_equal(reader(path, max_rows=10), arr[:10])
    np.testing.assert_array_equal(reader(path, max_rows=1000), arr)


def test_xvecs_rejects_truncated(tmp_path):
    path = tmp_path / "bad.fvecs"
    _write_xvecs(path, RNG.random((3, 4)).astype(np.float32))
    with open(path, "ab") as f:
        f.write(b"\0\0")
    with pytest.raises(ValueError):
        read_fvecs(path)


@pytest.mark.parametrize(
    "suffix, dtype", [(".fbin", np.float32), (".u8bin", np.uint8), (".i8bin", np.int8), (".ibin", np.int32)]
)
def test_bin_round_trip(tmp_path, suffix, dtype):
    arr = (RNG.random((23, 7)) * 100).astype(dtype)
    path = tmp_path / f"x{suffix}"
    _write_bin(path, arr)
    for got in (read_bin(path), read_vectors(path)):
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, arr)
    np.testing.assert_array_equal(read_bin(path, max_rows=4), arr[:4])


def test_npy_round_trip(tmp_path):
    arr = RNG.random((11, 3)).astype(np.float32)
    path = tmp_path / "x.npy"
    np.save(path, arr)
    np.testing.assert_array_equal(read_npy(path), arr)
    np.testing.assert_array_equal(read_vectors(path, max_rows=2), arr[:2])
    assert read_npy(path).flags.c_contiguous


def test_hdf5_round_trip(tmp_path):
    h5py = pytest.importorskip("h5py")
    train, test = RNG.random((9, 4)).astype(np.float32), RNG.random((3, 4)).astype(np.float32)
    path = tmp_path / "x.hdf5"
    with h5py.File(path, "w") as f:
        f["train"], f["test"] = train, test
        f["neighbors"] = np.zeros((3, 2), dtype=np.int32)
    np.testing.assert_array_equal(read_vectors(path), train)
    np.testing.assert_array_equal(read_hdf5(path, key="test", max_rows=2), test[:2])


def test_hdf5_without_h5py_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # makes `import h5py` fail
    with pytest.raises(ImportError, match="h5py"):
        read_hdf5(tmp_path / "x.hdf5")


def test_read_vectors_unknown_suffix(tmp_path):
    with pytest.raises(ValueError):
        read_vectors(tmp_path / "x.csv")


# --- named data sets ----------------------------------------------------------------------------


def test_load_bigann_10k():
    ds = load("bigann-10k")
    assert ds.base.shape == (10_000, 128) and ds.queries.shape == (100, 128)
    assert ds.base.dtype == np.float32 and ds.queries.dtype == np.float32
    assert ds.base.flags.c_contiguous and ds.queries.flags.c_contiguous
    assert ds.gt_ids.shape == (100, 100) and ds.gt_ids.dtype == np.int64
    assert ds.metric == "l2"


def test_load_holdout_and_cosine_sets():
    ho = load("bigann-10k-holdout")
    assert ho.base.shape == (9000, 128) and ho.queries.shape == (1000, 128)
    np.testing.assert_array_equal(ho.queries, load("bigann-10k").base[9000:])
    assert ho.gt_ids.max() < 9000
    wiki = load("wiki-minilm-15k")
    assert wiki.metric == "cosine" and wiki.base.dtype == np.float32
    assert np.all(np.diff(wiki.gt_dists[:, :10], axis=1) >= -1e-6)  # distances ascend


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="bigann-10k"):
        load("no-such-set")
    assert "bigann-10k" in datasets.available()


def test_parse_count():
    assert datasets.parse_count("10k") == 10_000
    assert datasets.parse_count("1M") == 1_000_000
    assert datasets.parse_count("2.5m") == 2_500_000
    assert datasets.parse_count("1234") == 1234
    with pytest.raises(ValueError):
        datasets.parse_count("1.5")


def test_load_synthetic_small(tmp_path, monkeypatch):
    monkeypatch.setenv("VINDEX_BENCH_CACHE", str(tmp_path))
    ds = load("synthetic-2k-d16")
    assert ds.base.shape == (2000, 16) and ds.queries.shape == (10_000, 16)
    assert ds.gt_ids.shape == (10_000, 100) and ds.metric == "l2"
    again = load("synthetic-2k-d16")  # from the cache this time
    np.testing.assert_array_equal(again.gt_ids, ds.gt_ids)


# --- ground truth and recall -----------------------------------------------------------------


def test_ground_truth_matches_shipped_bigann():
    ds = load("bigann-10k")
    ids, dists = ground_truth(ds.base, ds.queries, 10, "l2")
    assert ids.dtype == np.int64 and dists.dtype == np.float32 and ids.shape == (100, 10)
    # SIFT has exact distance ties, so compare distances computed exactly in int64.
    b = ds.base.astype(np.int64)
    q = ds.queries.astype(np.int64)
    exact = ((b[ids] - q[:, None, :]) ** 2).sum(-1)
    shipped = ((b[ds.gt_ids[:, :10]] - q[:, None, :]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.sort(exact, axis=1), np.sort(shipped, axis=1))
    assert recall_at_k(ids, ds.gt_ids, 10) >= 0.99


def test_ground_truth_metrics_ascending():
    base = RNG.standard_normal((300, 8)).astype(np.float32)
    q = RNG.standard_normal((20, 8)).astype(np.float32)
    for metric in ("l2", "cosine", "ip"):
        ids, dists = ground_truth(base, q, 5, metric, block=7)
        assert np.all(np.diff(dists, axis=1) >= -1e-6)
        if metric == "ip":
            ref = np.argsort(-(q @ base.T), axis=1, kind="stable")[:, :5]
        elif metric == "cosine":
            bn = base / np.linalg.norm(base, axis=1, keepdims=True)
            qn = q / np.linalg.norm(q, axis=1, keepdims=True)
            ref = np.argsort(-(qn @ bn.T), axis=1, kind="stable")[:, :5]
            np.testing.assert_allclose(dists[:, 0], 1 - (qn @ bn.T).max(1), atol=1e-5)
        else:
            ref = np.argsort(((q[:, None] - base[None]) ** 2).sum(-1), axis=1, kind="stable")[:, :5]
        assert recall_at_k(ids, ref, 5) == 1.0


def test_recall_at_k_hand_made():
    gt = np.array([[1, 2, 3, 9], [4, 5, 6, 9]])
    assert recall_at_k(np.array([[1, 2, 3], [4, 5, 6]]), gt, k=3) == 1.0
    assert recall_at_k(np.array([[3, 2, 1], [7, 8, 4]]), gt, k=3) == pytest.approx(4 / 6)
    assert recall_at_k(np.array([[1, -1, -1], [-1, -1, -1]]), gt, k=3) == pytest.approx(1 / 6)
    assert recall_at_k(np.array([[1, 1, 1], [9, 9, 9]]), gt, k=3) == pytest.approx(1 / 6)  # repeats count once
    assert recall_at_k(np.array([[1, 2, 3, 9]]), gt[:1], k=2) == 1.0  # only the first k columns count


# --- synthetic -------------------------------------------------------------------------------


def test_synthetic_deterministic_and_chunk_independent():
    n = 2 * synthetic.BLOCK + 123  # crosses block boundaries and ends mid-block
    b1, q1 = synthetic.make(n, d=32, n_queries=50, seed=3)
    b2, q2 = synthetic.make(n, d=32, n_queries=50, seed=3, chunk_rows=1000)
    b3, _ = synthetic.make(n, d=32, n_queries=0, seed=3, chunk_rows=7 * synthetic.BLOCK)
    assert b1.dtype == np.float32 and b1.shape == (n, 32) and q1.shape == (50, 32)
    np.testing.assert_array_equal(b1, b2)
    np.testing.assert_array_equal(b1, b3)
    np.testing.assert_array_equal(q1, q2)
    small, _ = synthetic.make(500, d=32, n_queries=0, seed=3)
    np.testing.assert_array_equal(small, b1[:500])  # smaller n = prefix of the same stream
    other, _ = synthetic.make(500, d=32, n_queries=0, seed=4)
    assert not np.array_equal(other, small)
    # Queries are fresh draws, not copies of base rows.
    assert not (q1[:, None, :] == b1[None, :, :]).all(-1).any()


def test_synthetic_is_neither_trivial_nor_hopeless():
    base, q = synthetic.make(5000, d=128, n_queries=200, seed=0)
    assert np.isfinite(base).all() and base.std() > 0
    _, dists = ground_truth(base, q, 10, "l2")
    far = ((q[:50, None, :] - base[None, :500, :]) ** 2).sum(-1).mean()
    contrast = np.sqrt(far / dists[:, 0].mean())  # mean / nearest distance
    # measured 1.98 here; SIFT 9k: 2.02; iid Gaussian: 1.24; generator at comp_scale=0.45: 6.2
    assert 1.5 < contrast < 4.0, contrast


# --- a peer and the measurement helpers -------------------------------------------------------


def test_faiss_ivfflat_peer_on_bigann():
    from bench.peers import PEERS, FaissIVFFlat

    ds = load("bigann-10k-holdout")
    peer = PEERS["faiss-ivfflat"](build_threads=2)
    assert isinstance(peer, FaissIVFFlat)
    peer.build(ds.base, ds.metric)
    assert peer.nlist == round(4 * np.sqrt(9000))
    assert [p["nprobe"] for p in peer.sweep()][:3] == [1, 2, 4]
    peer.set_params({"nprobe": 16})
    ids = peer.search(ds.queries, 10)
    assert ids.shape == (1000, 10) and ids.dtype == np.int64
    assert recall_at_k(ids, ds.gt_ids, 10) >= 0.85  # measured 0.908 (nprobe=16, nlist=379)


def test_measure_helpers():
    q = np.zeros((20, 4), dtype=np.float32)
    lat = measure.latencies(lambda x: x.sum(), q)
    assert lat.shape == (20,) and (lat >= 0).all()
    p = measure.percentiles(lat)
    assert set(p) == {"p50", "p99", "p999"} and p["p50"] <= p["p999"]
    assert measure.batch_qps(lambda x: x.sum(), q) > 0
    calls = []
    measure.timed(lambda: calls.append(time.sleep(0.002)), repeats=3, min_seconds=0.03)
    assert 10 <= len(calls) <= 16  # timed again until 30 ms of 2 ms calls, not just 3 of them
    order = []
    qa, qb, x = measure.paired_qps(lambda _: (order.append("a"), time.sleep(0.004)),
                                   lambda _: (order.append("b"), time.sleep(0.002)), q, repeats=4)
    assert order == ["a", "b", "b", "a", "a", "b", "b", "a"]  # in turns, the first alternating
    assert qb > qa and 1.4 < x < 2.5  # b takes half a's time: about twice its speed
    assert measure.current_rss() > 0
    small = measure.rss_of_subprocess("x = 1")
    big = measure.rss_of_subprocess("import numpy as np\na = np.ones(64 * 2**20 // 8)")
    assert big - small > 50 * 2**20


def test_streaming_recall_at_equal_cost_reads_the_frontier():
    """A setting beaten on both recall and cost is not interpolated through; outside the
    measured range there is no answer, except beyond the curve's costly end."""
    from bench.streaming import _recall_at

    curve = [{"recall": 0.56, "qps": 90.0, "distances": 150.0},   # beaten by the next
             {"recall": 0.75, "qps": 110.0, "distances": 300.0},
             {"recall": 0.90, "qps": 85.0, "distances": 600.0},
             {"recall": 0.97, "qps": 60.0, "distances": 1100.0}]
    assert _recall_at(curve, "qps", 97.5) == pytest.approx(0.75 + (97.5 - 110) / (85 - 110) * (0.90 - 0.75))
    assert _recall_at(curve, "qps", 200.0) is None       # faster than any setting
    assert _recall_at(curve, "qps", 30.0) == 0.97        # slower than the slowest
    assert _recall_at(curve, "distances", 225.0) == pytest.approx(0.56 + 0.5 * (0.75 - 0.56))
    assert _recall_at(curve, "distances", 5000.0) == 0.97
    assert _recall_at(curve, "distances", 100.0) is None


@pytest.mark.parametrize("name,factor", [("clustered_runbook", 10.0), ("delete_runbook", 1.0),
                                         ("simple_replace_runbook", 1.0)])
def test_bundled_runbooks_play_as_bench_streaming_reads_them(name, factor):
    """bench.streaming's reading of the bundled big-ann-benchmarks runbooks (as scaled for
    glove-100k and bigann-10k): inserts bring new ids, deletes and replaces name live ones,
    every row stays inside the scaled data set, and there are searches to measure."""
    from bench import runbook

    key, max_pts, raw = runbook.load(f"{measure.REPO_ROOT}/data/runbooks/big-ann-benchmarks/{name}.yaml")
    steps = runbook.scaled(raw, factor)
    live = runbook.LiveSet()
    for step in steps:
        ids = set(step.ids.tolist())
        if step.op == "insert":
            assert not ids & live.row_of.keys(), f"{key}: an insert reuses live ids"
        elif step.op in ("delete", "replace"):
            assert ids <= live.row_of.keys(), f"{key}: a {step.op} names ids that are not live"
        assert step.rows.size == 0 or step.rows.max() < runbook.max_row(raw) * factor
        live.apply(step)
    assert any(s.op == "search" for s in steps)
    assert 0 < len(live.row_of) <= max_pts * factor
