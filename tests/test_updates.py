"""upsert / delete / get / wait_idle and background rebalancing."""
from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

import vindex
from conftest import brute_force, recall_at_k

ALL = dict(max_postings=4096, eps=float("inf"), ef=4096)
SMALL = dict(posting_limit_bytes=1024)  # 8-d records are 40 bytes: 25 vectors per posting


def ints(rng, n, d=8):
    """Small integer vectors: float32 distances are exact, so results compare exactly."""
    return rng.integers(0, 20, (n, d)).astype(np.float32)


def check_exact(index, model: dict[int, np.ndarray], queries: np.ndarray, k: int = 10):
    ids = np.array(sorted(model), dtype=np.int64)
    base = np.stack([model[i] for i in ids]) if ids.size else np.zeros((0, queries.shape[1]))
    got, dists = index.search(queries, k, **ALL)
    if ids.size == 0:
        assert (got == -1).all()
        return
    want, want_d = brute_force(base, queries, min(k, ids.size), ids=ids)
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    np.testing.assert_array_equal(dists[:, :want.shape[1]], want_d.astype(np.float32))
    assert (got[:, want.shape[1]:] == -1).all()


def test_upsert_replaces_and_never_returns_the_old_vector(tmp_path):
    rng = np.random.default_rng(0)
    old = ints(rng, 300)
    with vindex.Index.build(tmp_path / "u", old, **SMALL) as index:
        new = old[:100] + 100  # far away
        index.upsert(np.arange(100), new)
        assert len(index) == 300
        got, dists = index.search(old[:100], 1, **ALL)
        # querying with the old vectors: the replaced ids must not come back at distance 0
        assert not ((got[:, 0] == np.arange(100)) & (dists[:, 0] == 0)).any()
        vecs, found = index.get(np.arange(100))
        assert found.all() and np.array_equal(vecs, new)
        model = {i: (new[i] if i < 100 else old[i]) for i in range(300)}
        check_exact(index, model, ints(rng, 20))
        index.wait_idle()
        check_exact(index, model, ints(rng, 20))


def test_delete_counts_ignores_unknown_and_hides_ids(tmp_path):
    rng = np.random.default_rng(1)
    base = ints(rng, 200)
    with vindex.Index.build(tmp_path / "d", base, **SMALL) as index:
        assert index.delete([5, 6, 7, 10_000]) == 3
        assert index.delete([5, 6]) == 0  # already gone
        assert index.delete([]) == 0
        assert len(index) == 197
        got, _ = index.search(base, 10, **ALL)
        assert not np.isin(got, [5, 6, 7]).any()
        vecs, found = index.get([5, 8, 10_000])
        assert found.tolist() == [False, True, False]
        assert np.array_equal(vecs[1], base[8]) and not vecs[0].any() and not vecs[2].any()
        assert index.stats()["tombstones"] == 3
        index.add([5], base[5] + 1)  # a deleted id may be added again
        vecs, found = index.get([5])
        assert found[0] and np.array_equal(vecs[0], base[5] + 1)


def test_add_existing_id_names_it_and_writes_nothing(tmp_path):
    rng = np.random.default_rng(2)
    base = ints(rng, 50)
    with vindex.Index.build(tmp_path / "a", base) as index:
        seq = index.stats()["log_seq"]
        with pytest.raises(vindex.DuplicateIdError, match=r"\[3, 7\]") as err:
            index.add([60, 3, 7], ints(rng, 3))
        assert err.value.ids == [3, 7]
        assert len(index) == 50 and index.stats()["log_seq"] == seq
        assert not index.get([60])[1][0]


def test_splits_keep_postings_within_limit_after_wait_idle(tmp_path):
    rng = np.random.default_rng(3)
    model = {}
    with vindex.Index.create(tmp_path / "s", dim=8, **SMALL) as index:
        for lo in range(0, 3000, 250):  # the first batch bootstraps, later ones split postings
            x = ints(rng, 250)
            index.upsert(np.arange(lo, lo + 250), x)
            model.update(zip(range(lo, lo + 250), x))
        assert index.wait_idle(timeout=60)
        s = index.stats()
        assert s["posting_max"] <= s["posting_limit"] and s["postings_over_limit"] == 0
        assert s["splits"] > 0 and s["background_queue"] == 0 and s["background_errors"] == 0
        # copies moved out of a posting are cut once they and its garbage reach CUT_FRACTION
        # of it; fewer wait (and searches skip them as duplicates meanwhile)
        from vindex.rebalance import CUT_FRACTION
        eng, rb = index._engine, index._rebalancer
        stale = {p: k.size for p, k in rb.cuts._stale.items()}
        pids = np.array(sorted(stale), dtype=np.int64)
        if pids.size:
            waiting = np.array([stale[p] for p in pids.tolist()]) + eng.state.garbage[pids]
            assert (waiting < np.maximum(1, CUT_FRACTION * eng.lengths(pids))).all()
        assert s["stale_copies"] == sum(stale.values())
        check_exact(index, model, ints(rng, 30))
        vecs, found = index.get(np.arange(3000))
        assert found.all() and np.array_equal(vecs, np.stack([model[i] for i in range(3000)]))


def test_copies_waiting_to_be_cut_survive_a_close_not_a_crash(tmp_path):
    """Copies moved out of a posting and not cut yet are saved by close's checkpoint and
    waiting again after reopening (else they stay in their postings as duplicates until
    scrubbed). After a crash the log after the checkpoint may move copies back, so they are
    forgotten instead; either way the index verifies and searches stay exact."""
    import shutil

    rng = np.random.default_rng(13)
    model = {}
    index = vindex.Index.create(tmp_path / "s", dim=8, scrub_ratio=0, **SMALL)
    for lo in range(0, 3000, 250):
        x = ints(rng, 250)
        index.upsert(np.arange(lo, lo + 250), x)
        model.update(zip(range(lo, lo + 250), x))
    index.upsert([5000], ints(rng, 1))  # a log record after the periodic checkpoint
    model[5000] = index.get([5000])[0][0]
    # after the last upsert: the split it may cause leaves copies waiting too
    assert index.wait_idle(timeout=60)
    waiting = {p: k.copy() for p, k in index._rebalancer.cuts._stale.items()}
    assert sum(k.size for k in waiting.values()) > 0
    shutil.copytree(tmp_path / "s", tmp_path / "crashed")  # as a kill leaves it
    index.close()
    for path, restored in ((tmp_path / "s", True), (tmp_path / "crashed", False)):
        with vindex.Index.open(path) as again:
            assert again.wait_idle(timeout=60)
            stale = again._rebalancer.cuts._stale
            if restored:
                assert again.stats()["stale_copies"] > 0
                assert all(np.isin(k, waiting.get(p, k[:0])).all() for p, k in stale.items())
            else:
                assert again.stats()["stale_copies"] == 0
            assert again.verify().ok
            check_exact(again, model, ints(rng, 30))


def test_paused_background_starts_no_round_and_catches_up_after(tmp_path):
    rng = np.random.default_rng(8)
    model = {}
    with vindex.Index.create(tmp_path / "p", dim=8, **SMALL) as index:
        x = ints(rng, 250)
        index.upsert(np.arange(250), x)
        model.update(zip(range(250), x))
        assert index.wait_idle(timeout=60)
        before = index.stats()
        with index.pause_background():
            for lo in range(250, 2000, 250):
                x = ints(rng, 250)
                index.upsert(np.arange(lo, lo + 250), x)
                model.update(zip(range(lo, lo + 250), x))
            assert not index.wait_idle(timeout=0.5)  # queued, and none of it may run
            held = index.stats()
            assert held["background_rounds"] == before["background_rounds"] and held["splits"] == before["splits"]
            assert held["postings_over_limit"] > 0 and held["background_queue"] > 0
            assert held["scrub_pending"] > 0  # the upserts earned re-checks; none ran
            check_exact(index, model, ints(rng, 20))
        assert index.wait_idle(timeout=60)
        s = index.stats()
        assert s["splits"] > before["splits"] and s["postings_over_limit"] == 0 and s["scrub_pending"] == 0
        check_exact(index, model, ints(rng, 20))


def test_background_threads_know_the_interpreter_is_exiting_before_pools_refuse_work():
    """At exit the thread pools refuse work while the main thread still reads as alive; a
    thread that meets the refusal must already see ``interpreter_exiting()``."""
    script = """
import os, threading
from concurrent.futures import ThreadPoolExecutor
from vindex.exiting import interpreter_exiting
pool = ThreadPoolExecutor(1)
def watch():
    while True:
        try:
            pool.submit(int).result()
        except RuntimeError:
            os.write(1, f"exiting={interpreter_exiting()}".encode())
            os._exit(0)
threading.Thread(target=watch).start()  # not a daemon: joined after the exit hooks ran
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.stdout == "exiting=True", (res.stdout, res.stderr)


def test_an_index_left_open_at_exit_stops_its_background_quietly(tmp_path):
    # at exit the interpreter shuts thread pools down before it finalizes the index, so a
    # round running then failed and logged a traceback
    script = f"""
import numpy as np, vindex
index = vindex.Index.create({str(tmp_path / "x")!r}, dim=8, **{SMALL!r})
rng = np.random.default_rng(0)
for lo in range(0, 20000, 2000):
    index.upsert(np.arange(lo, lo + 2000), rng.integers(0, 20, (2000, 8)).astype(np.float32))
assert index.stats()["background_queue"] > 0  # work queued or running at exit
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    with vindex.Index.open(tmp_path / "x") as index:  # what was left is done after reopening
        assert index.wait_idle(timeout=120)
        s = index.stats()
        assert s["live"] == 20000 and s["postings_over_limit"] == 0


def test_rebalance_off_only_appends(tmp_path):
    rng = np.random.default_rng(4)
    with vindex.Index.create(tmp_path / "o", dim=8, rebalance=False, **SMALL) as index:
        for lo in range(0, 2000, 500):
            index.upsert(np.arange(lo, lo + 500), ints(rng, 500))
        assert index.wait_idle(timeout=5)
        s = index.stats()
        assert s["splits"] == 0 and s["reassigns"] == 0
        assert s["postings_over_limit"] > 0  # nothing split them


def test_merges_after_heavy_deletes(tmp_path):
    rng = np.random.default_rng(5)
    base = ints(rng, 2000)
    with vindex.Index.build(tmp_path / "m", base, **SMALL) as index:
        heads = index.stats()["heads"]
        kill = np.arange(0, 2000)[np.arange(2000) % 10 != 0]  # keep every tenth
        assert index.delete(kill) == kill.size
        assert index.wait_idle(timeout=60)
        s = index.stats()
        assert s["merges"] + s["drops"] > 0 and s["heads"] < heads
        model = {i: base[i] for i in range(0, 2000, 10)}
        check_exact(index, model, ints(rng, 30))


def test_version_wrap_moves_the_id_to_a_fresh_vid(tmp_path):
    rng = np.random.default_rng(6)
    with vindex.Index.build(tmp_path / "w", ints(rng, 40)) as index:
        vectors = [ints(rng, 1) for _ in range(130)]
        for v in vectors:  # the 7-bit version wraps after 127 replacements
            index.upsert([0], v)
        assert index.stats()["retired_vids"] == 1
        got, found = index.get([0])
        assert found[0] and np.array_equal(got, vectors[-1])
        hits, dists = index.search(vectors[-1], 40, **ALL)
        assert (hits[0] == 0).sum() == 1
        for v in vectors[:-1]:  # no older copy of id 0 is ever live again
            if not np.array_equal(v, vectors[-1]):
                h, d = index.search(v, 40, **ALL)
                row = h[0] == 0
                assert row.sum() == 1 and d[0][row][0] == ((v - vectors[-1]) ** 2).sum()


def test_unclean_exit_during_rebalancing_reopens_consistent(tmp_path):
    rng = np.random.default_rng(7)
    model = {}
    index = vindex.Index.create(tmp_path / "c", dim=8, **SMALL)
    for lo in range(0, 2000, 200):
        x = ints(rng, 200)
        index.upsert(np.arange(lo, lo + 200), x)
        model.update(zip(range(lo, lo + 200), x))
    index.delete(np.arange(0, 2000, 3))
    for i in range(0, 2000, 3):
        del model[i]
    del index  # background work may be mid-round; no close, no checkpoint
    import gc

    gc.collect()
    with vindex.Index.open(tmp_path / "c") as again:
        assert len(again) == len(model)
        check_exact(again, model, ints(rng, 30))
        again.wait_idle(timeout=60)
        check_exact(again, model, ints(rng, 30))
        assert again.stats()["postings_over_limit"] == 0


def test_churn_bigann_10k_keeps_recall(tmp_path, bigann):
    """10 rounds: delete 10% of the live set, insert as many unseen vectors."""
    base = bigann["base"].astype(np.float32)
    rng = np.random.default_rng(8)
    live = np.arange(5000)
    unseen = list(range(5000, 10000))
    q = base[rng.choice(10000, 200, replace=False)] + rng.normal(0, 4, (200, 128)).astype(np.float32)
    with vindex.Index.build(tmp_path / "churn", base[:5000]) as index:
        for _ in range(10):
            kill = rng.choice(live, 500, replace=False)
            assert index.delete(kill) == 500
            live = np.setdiff1d(live, kill)
            new = np.array([unseen.pop() for _ in range(500)])
            index.upsert(new, base[new])
            live = np.union1d(live, new)
            assert index.wait_idle(timeout=60)
            s = index.stats()
            assert s["postings_over_limit"] == 0 and s["live"] == live.size
        truth, _ = brute_force(base[live], q, 10, ids=live)
        churned = recall_at_k(index.search(q, 10, max_postings=16).ids, truth)
        np.testing.assert_array_equal(index.search(q, 10, **ALL).ids, truth)
    with vindex.Index.build(tmp_path / "fresh", base[live], ids=live) as fresh:
        rebuilt = recall_at_k(fresh.search(q, 10, max_postings=16).ids, truth)
    assert churned >= rebuilt - 0.03  # measured: churned 0.952, fresh build 0.963


def test_writes_after_reopening_a_checkpointed_index_survive(tmp_path):
    """The log is empty after a checkpoint; later records must still number above it."""
    rng = np.random.default_rng(9)
    path = tmp_path / "r"
    vindex.Index.create(path, dim=8).close()
    expect = 0
    for round_ in range(3):
        with vindex.Index.open(path) as index:
            index.upsert(np.arange(round_ * 10, round_ * 10 + 10), ints(rng, 10))
            expect += 10
    with vindex.Index.open(path) as index:
        assert len(index) == expect == 30


def test_a_split_leaves_children_about_as_full_as_a_build():
    from vindex.rebalance import split_children
    limit, fill = 94, 0.5  # 128-d records in the default budget; a build fills 47 of them
    got = split_children(np.array([95, 140, 141, 300, 1000]), limit, fill)
    np.testing.assert_array_equal(got, [2, 3, 3, 6, 21])
    # one over the limit: two children, each above the merge threshold
    assert 95 / split_children(np.array([95]), limit, fill)[0] > vindex.IndexConfig().merge_fraction * limit
    assert split_children(np.array([95]), limit, 1.0)[0] == 2  # never fewer than two


def test_far_vectors_get_new_heads_only_where_they_cluster(tmp_path):
    """Vectors far outside every posting get heads of their own when they form a new region,
    not when they are scattered in all directions (a head at their centre would be farther
    from each of them than the heads they have)."""
    rng = np.random.default_rng(9)
    centres = rng.normal(0, 40, (8, 8)).astype(np.float32)
    base = (centres[rng.integers(0, 8, 2000)] + rng.normal(0, 1, (2000, 8))).astype(np.float32)
    with vindex.Index.build(tmp_path / "f", base, **SMALL) as index:
        heads = index.stats()["heads"]
        directions = rng.normal(0, 1, (40, 8))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        scattered = (centres[rng.integers(0, 8, 40)] + 30 * directions).astype(np.float32)
        index.upsert(np.arange(5000, 5040), scattered)
        assert index.stats()["heads"] == heads  # only appended: no head would be nearer
        region = (np.full(8, 300, np.float32) + rng.normal(0, 1, (40, 8))).astype(np.float32)
        index.upsert(np.arange(6000, 6040), region)
        assert index.stats()["heads"] > heads  # a new region: heads of its own
        got = index.search(region[:5], 1).ids[:, 0]
        np.testing.assert_array_equal(got, np.arange(6000, 6005))


def test_a_copy_written_back_is_not_cut_later(tmp_path):
    # a reassignment or merge back into a posting cancels cuts pending for that copy there,
    # in the deferred queue and among the stale copies, and nowhere else
    with vindex.Index.create(tmp_path / "c", dim=8, **SMALL) as index:
        rb, readers = index._rebalancer, index._engine.readers
        assert index.wait_idle(timeout=10)
        with readers.search():  # a running search holds the deferred cuts back
            with rb._cv:
                rb.cuts._stale = {5: np.array([1, 2, 3]), 7: np.array([4]), 8: np.array([2])}
                rb.cuts._deferred = [(readers.now(), [], {5: np.array([2, 6]), 9: np.array([1])})]
            rb.cuts.cancel(np.array([5, 7, 9, 5]), np.array([2, 9, 1, 3]))
            with rb._cv:
                stale = {p: k.tolist() for p, k in rb.cuts._stale.items()}
                deferred = {p: k.tolist() for p, k in rb.cuts._deferred[0][2].items()}
                rb.cuts._stale, rb.cuts._deferred = {}, []
        assert stale == {5: [1], 7: [4], 8: [2]}
        assert deferred == {5: [6], 9: []}


def test_moves_planned_before_a_posting_was_rewritten_leave_its_vectors_in_place(tmp_path):
    # the reassignment after a round's splits is planned while the next round commits: a
    # vector seen in a posting the rebalancer rewrote meanwhile may have lost the copy the
    # plan counted on there, so applying the plan leaves it where it is
    rng = np.random.default_rng(21)
    with vindex.Index.create(tmp_path / "o", dim=8, scrub_ratio=0, **SMALL) as index:
        index.upsert(np.arange(2000), ints(rng, 2000))
        assert index.wait_idle(timeout=60)
        rb, eng = index._rebalancer, index._engine
        with index.pause_background():
            assert index.wait_idle(timeout=0.1)  # nothing queued, the worker waits
            vids = np.arange(0, 2000, 50, dtype=np.int64)
            vecs, _ = index.get(vids)
            versions = eng.state.idmap.versions[vids].astype(np.uint8)
            home = eng.state.idmap.home[vids].astype(np.int64)
            # claim a copy of each in a posting far from it: no longer picked, so each moves
            far = np.full(vids.size, int(np.flatnonzero(eng.state.graph.alive)[0]), dtype=np.int64)
            holders = (np.concatenate((np.arange(vids.size), np.arange(vids.size))), np.concatenate((home, far)))
            plan = rb.reassign.plan_moves(vids, versions, vecs, home, holders)
            assert plan.vids.size > 0
            before = dict(rb.counters)
            stamp = rb.cuts.stamp
            rb.cuts.mark_rewritten(far[:1])
            rb.reassign.apply_moves(plan, stamp)
            assert rb.counters["reassigns"] == before["reassigns"]
            assert rb.counters["reassign_overtaken"] - before["reassign_overtaken"] == plan.vids.size
            rb.reassign.apply_moves(plan, rb.cuts.stamp)  # nothing rewritten since: the moves go ahead
            assert rb.counters["reassigns"] - before["reassigns"] == plan.vids.size
        assert index.wait_idle(timeout=60)
        assert index.verify().ok
        got, found = index.get(np.arange(2000))
        assert found.all()


def test_reading_ahead_returns_what_reading_each_list_does(tmp_path):
    # reassignment reads the next neighbourhood while it works on the current one
    rng = np.random.default_rng(12)
    with vindex.Index.create(tmp_path / "r", dim=8, **SMALL) as index:
        index.upsert(np.arange(2000), ints(rng, 2000))
        assert index.wait_idle(timeout=60)
        rb, g = index._rebalancer, index._engine.state.graph
        alive = np.flatnonzero(g.alive[: g.n])
        lists = [alive[:5], alive[3:20], alive[-7:], alive[:0]]
        ahead = list(rb.reader.read_ahead(lists))
        assert len(ahead) == len(lists)
        for got, pids in zip(ahead, lists):
            want = rb.reader.read(pids)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(a, b)
        reads = rb.reader.read_ahead(lists)
        next(reads)
        reads.close()  # a caller that stops early leaves no read behind
        rb.reader.pool.submit(lambda: None).result(timeout=10)


def test_rewritten_postings_move_their_heads_to_their_vectors_and_replay_it(tmp_path):
    """A posting rewritten without its garbage moves its head to the mean of the vectors
    whose home it is; the move is in the operation log, so a crash keeps it."""
    rng = np.random.default_rng(8)
    base = ints(rng, 600)
    index = vindex.Index.build(tmp_path / "r", base, merge_fraction=0.2, **SMALL)  # rewrites, no merges
    g, idm = index._engine.state.graph, index._engine.state.idmap
    built = g.vectors[: g.n].copy()
    index.delete(np.arange(0, 600, 10))  # a tenth of each posting dead
    assert index.wait_idle(60)
    assert index.stats()["gc"] > 0
    live = np.setdiff1d(np.arange(600), np.arange(0, 600, 10))
    homes = idm.home[idm.live_vids(live)]
    moved = [p for p in np.flatnonzero(g.alive[: built.shape[0]]) if not np.array_equal(g.vectors[p], built[p])]
    assert len(moved) > 5
    for p in moved:
        np.testing.assert_allclose(g.vectors[p], base[live[homes == p]].mean(axis=0), rtol=1e-5)
    heads = g.vectors[: g.n].copy()
    del index, g, idm  # no close, no checkpoint: the moves come back from the log
    import gc

    gc.collect()
    with vindex.Index.open(tmp_path / "r", rebalance=False) as again:
        np.testing.assert_array_equal(again._engine.state.graph.vectors[: heads.shape[0]], heads)
        check_exact(again, {i: base[i] for i in live}, ints(rng, 30))


def test_upserts_search_replicas_on_their_own_thread_while_searches_miss_their_target(tmp_path, monkeypatch):
    # the upsert pool's threads each hand the GIL back when their kernel ends: while small
    # searches miss their p99 target, an upsert searches for replicas on its own thread
    from vindex import writes
    rng = np.random.default_rng(3)
    pools = []
    real = writes.plan_upsert

    def plan(state, exts, x, config, pool, *rest):
        pools.append(pool)
        return real(state, exts, x, config, pool, *rest)

    monkeypatch.setattr(writes, "plan_upsert", plan)
    with vindex.Index.build(tmp_path / "p", ints(rng, 300), rebalance=False) as index:
        index.upsert(np.arange(300, 310), ints(rng, 10))
        index._engine.update_pacer.bucket.rate = 0.7  # as after a window of slow searches
        index.upsert(np.arange(310, 320), ints(rng, 10))
        assert pools == [index._pool, None] and index._pool is not None
        assert len(index) == 320


def test_a_round_keeps_what_was_written_between_its_read_and_the_writers_lock(tmp_path):
    # a round reads its postings without the writers' lock: vectors upserted into them after
    # the read, before the round takes the lock, must survive the round's rewrite of them
    rng = np.random.default_rng(31)
    model = {}
    with vindex.Index.create(tmp_path / "w", dim=8, scrub_ratio=0, **SMALL) as index:
        x = ints(rng, 2000)
        index.upsert(np.arange(2000), x)
        model.update(zip(range(2000), x))
        assert index.wait_idle(timeout=60)
        rb, eng = index._rebalancer, index._engine
        fetch, grew = rb.reader.fetch, []

        def fetch_then_write(pids):
            fetched = fetch(pids)
            if threading.current_thread() is rb._thread and not eng.lock._is_owned() and not grew:
                # one vector at each head read: most land in the posting just read
                y = np.rint(eng.state.graph.vectors[pids])
                ids = np.arange(10_000, 10_000 + y.shape[0])
                index.upsert(ids, y)
                model.update(zip(ids.tolist(), y))
                grew.append(int((eng.lengths(pids) > np.diff(fetched[1])).sum()))
            return fetched

        rb.reader.fetch = fetch_then_write
        y = ints(rng, 1000)  # postings go over their limit: a round reads and splits them
        index.upsert(np.arange(2000, 3000), y)
        model.update(zip(range(2000, 3000), y))
        assert index.wait_idle(timeout=60)
        assert grew and grew[0] > 10  # the round read postings that then grew
        assert index.stats()["splits"] > 0
        assert index.verify().ok
        check_exact(index, model, ints(rng, 30), k=50)
        ids = np.array(sorted(model))
        vecs, found = index.get(ids)
        assert found.all() and np.array_equal(vecs, np.stack([model[i] for i in ids.tolist()]))
