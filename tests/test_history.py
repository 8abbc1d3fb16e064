"""Concurrency history check: two writers upsert and delete ids of one small id space (racing on
the same ids) while four readers get and search, with background splits, merges, reassignments
and garbage collection running. Every call is timed; afterwards :func:`history.check_history`
checks each read against the writes that completed before it began and the ones that overlapped
it (rules in ``tests/history.py``)."""
from __future__ import annotations

import contextlib
import itertools
import threading
import time

import numpy as np
import pytest

import vindex
from conftest import run_for
from history import Read, Write, check_history

DIM = 8
ID_SPACE = 192           # small, so writers race on the same ids and a complete search is cheap
HOT = 16                 # half of all writes go to ids 0..HOT-1
ALL = dict(max_postings=4096, eps=float("inf"), ef=4096)
# 8-d records are 40 bytes: a 1 KiB budget holds 25 vectors, so postings split all the time;
# a scrub every written vector and frequent checkpoints keep the background busy as well
CONFIG = dict(posting_limit_bytes=1024, checkpoint_every=500, scrub_ratio=1.0)
CENTRES = np.random.default_rng(42).integers(120, 600, (8, DIM - 2))


def make_vectors(rng, tokens: list[int], phase: int) -> np.ndarray:
    """One vector per token, unique to it. Integer coordinates below 700 keep float32 squared
    distances exact. Six coordinates place it near one of 8 centres (the centres in use drift
    with ``phase``, so postings fill, split, empty and merge); the last two spell the token."""
    out = np.empty((len(tokens), DIM), np.float32)
    for row, t in enumerate(tokens):
        c = (phase + int(rng.integers(0, 3))) % CENTRES.shape[0]
        out[row, :DIM - 2] = CENTRES[c] + rng.integers(-50, 51, DIM - 2)
        out[row, DIM - 2:] = (t // 400, t % 400)
    return out


def pick_ids(rng, n: int) -> list[int]:
    pool = HOT if rng.random() < 0.5 else ID_SPACE
    return rng.choice(pool, min(n, pool), replace=False).tolist()


def run_history(path, seconds: float, seed: int = 0) -> tuple[list[Write], list[Read], dict, list[str]]:
    index = vindex.Index.create(path, dim=DIM, **CONFIG)
    tokens = itertools.count(1)
    writes: list[Write] = []          # list.append is atomic under the GIL
    reads: list[Read] = []
    recent: list[np.ndarray] = []     # vectors written lately: queries that hit stored values
    failures: list[str] = []
    stop = threading.Event()

    def do_write(writer: int, seq: int, kind: str, ids: list[int], x: np.ndarray | None) -> None:
        t0 = time.monotonic_ns()
        ok = True
        try:
            index.upsert(ids, x) if kind == "upsert" else index.delete(ids)
        except Exception as e:  # noqa: BLE001 - recorded; the test fails on it
            ok = False
            failures.append(f"writer {writer} {kind} {ids}: {type(e).__name__}: {e}")
        t1 = time.monotonic_ns()
        writes.append(Write(writer, seq, kind, tuple(ids), x, t0, t1, ok))
        if x is not None:
            recent.extend(x)

    # every id starts with a value, so the first clustering has the whole id space
    init_rng = np.random.default_rng(seed)
    do_write(-1, 0, "upsert", list(range(ID_SPACE)),
             make_vectors(init_rng, [next(tokens) for _ in range(ID_SPACE)], 0))

    def writer(w: int) -> None:
        rng = np.random.default_rng(seed * 100 + w)
        for seq in itertools.count():
            if stop.is_set():
                return
            ids = pick_ids(rng, int(rng.integers(1, 5)))
            if rng.random() < 0.3:
                do_write(w, seq, "delete", ids, None)
            else:
                do_write(w, seq, "upsert", ids, make_vectors(rng, [next(tokens) for _ in ids], seq // 40))

    def reader(r: int) -> None:
        rng = np.random.default_rng(seed * 100 + 50 + r)
        while not stop.is_set():
            time.sleep(float(rng.uniform(0, 0.002)))  # leave the writers some of the GIL
            u = rng.random()
            try:
                if u < 0.35:
                    ids = pick_ids(rng, int(rng.integers(1, 17)))
                    t0 = time.monotonic_ns()
                    x, found = index.get(ids)
                    t1 = time.monotonic_ns()
                    reads.append(Read(r, "get", t0, t1, np.asarray(ids), found=found, vectors=x))
                    continue
                if u < 0.7:  # complete: every id that is live comes back, with its distance
                    nq, k, complete = int(rng.integers(1, 3)), ID_SPACE, True
                else:        # stored vectors as queries, a few nearest
                    nq, k, complete = int(rng.integers(1, 5)), int(rng.integers(1, 4)), False
                q = np.stack([recent[int(rng.integers(max(0, len(recent) - 500), len(recent)))]
                              if rng.random() < 0.7 else rng.integers(0, 700, DIM).astype(np.float32)
                              for _ in range(nq)])
                t0 = time.monotonic_ns()
                res = index.search(q, k, **ALL)
                t1 = time.monotonic_ns()
                for row in range(nq):
                    reads.append(Read(r, "search", t0, t1, res.ids[row], query=q[row],
                                      distances=res.distances[row], complete=complete))
            except Exception as e:  # noqa: BLE001
                failures.append(f"reader {r}: {type(e).__name__}: {e}")
                return

    threads = ([threading.Thread(target=writer, args=(w,)) for w in range(2)]
               + [threading.Thread(target=reader, args=(r,)) for r in range(4)])
    run_for(threads, seconds, stop)
    # after the background is done: one more get of every id and a complete search
    assert index.wait_idle(timeout=120)
    t0 = time.monotonic_ns()
    x, found = index.get(np.arange(ID_SPACE))
    res = index.search(x[0], ID_SPACE, **ALL)
    t1 = time.monotonic_ns()
    reads.append(Read(-1, "get", t0, t1, np.arange(ID_SPACE), found=found, vectors=x))
    reads.append(Read(-1, "search", t0, t1, res.ids[0], query=x[0], distances=res.distances[0], complete=True))
    stats = index.stats()
    index.close()
    return writes, reads, stats, failures


def _run_and_check(tmp_path, seconds: float, seed: int) -> None:
    """Run and check one history: no violation of any rule."""
    writes, reads, stats, failures = run_history(tmp_path / "h", seconds, seed)
    assert not failures, failures[:5]
    t0 = time.perf_counter()
    violations = check_history(writes, reads)
    took = time.perf_counter() - t0
    assert not violations, "\n".join(map(str, violations[:10]))
    # the run exercised what it is meant to: races on the same ids, every read kind, rebalancing
    kinds = {(r.kind, r.complete) for r in reads}
    assert kinds == {("get", False), ("search", True), ("search", False)}
    assert sum(w.kind == "delete" for w in writes) > 50 and len(reads) > 500
    assert stats["background_errors"] == 0
    assert stats["splits"] > 0 and stats["reassigns"] > 0 and stats["merges"] + stats["drops"] > 0
    print(f"\n{len(writes)} writes, {len(reads)} reads, checked in {took:.2f} s; splits {stats['splits']}, "
          f"merges {stats['merges']}, drops {stats['drops']}, reassigns {stats['reassigns']}, gc {stats['gc']}")


def test_history_is_consistent(tmp_path):
    _run_and_check(tmp_path, seconds=6.0, seed=0)


@pytest.mark.slow
def test_history_is_consistent_long(tmp_path):
    for seed in (1, 2, 3):
        _run_and_check(tmp_path / str(seed), seconds=60.0, seed=seed)


def _small_index(path):
    base = np.random.default_rng(0).integers(0, 20, (300, 8)).astype(np.float32)
    return vindex.Index.build(path, base, posting_limit_bytes=1024, rebalance=False), base


@contextlib.contextmanager
def _paused_search(index, query, *, before_reading: bool):
    """Run an exhaustive search in a thread that pauses just before (or just after) its read
    section; the body runs while it is paused. Yields a dict that holds the result after."""
    readers = index._engine.readers
    real_reading = readers.reading
    paused, go = threading.Event(), threading.Event()

    def pause() -> None:
        if threading.current_thread().name == "paused-search":
            paused.set()
            go.wait(30)

    @contextlib.contextmanager
    def reading():
        if before_reading:
            pause()
        with real_reading():
            yield
        if not before_reading:
            pause()

    readers.reading = reading
    out: dict = {}
    t = threading.Thread(name="paused-search", target=lambda: out.update(res=index.search(query, 300, **ALL)))
    t.start()
    try:
        assert paused.wait(30)
        yield out
    finally:
        go.set()
        t.join()
        readers.reading = real_reading


def test_search_racing_an_upsert_into_new_heads(tmp_path):
    """Minimal deterministic form of what the history check finds. A search picks its heads,
    then (paused here, between picking heads and reading postings) an upsert replaces ids 0..19
    with vectors far from every head: they get new heads of their own (``new_head_factor``),
    the new copies go only there, and the version map moves on. The search then reads the
    postings it picked against the new versions: the old copies no longer match and the new
    ones are in heads it never chose, so ids live before, during and after the upsert were
    missing from an exhaustive search (a background split that makes new heads between the two
    steps, followed by an upsert of ids whose copies moved there, did the same). A search now
    starts over when its read section sees heads newer than its choice."""
    index, base = _small_index(tmp_path / "r")
    with _paused_search(index, base[0], before_reading=True) as out:
        heads = index.stats()["heads"]
        index.upsert(np.arange(20), base[:20] + 1000.0)
        assert index.stats()["heads"] > heads  # the upsert made heads for its far vectors
    got = set(out["res"].ids[0].tolist())
    after = set(index.search(base[0], 300, **ALL).ids[0].tolist())
    index.close()
    assert after == set(range(300))
    missing = sorted(set(range(300)) - got)
    assert not missing, f"ids live throughout missing from an exhaustive search: {missing}"


def test_search_racing_a_version_wrap(tmp_path):
    """The bug the 60-second history check found. A search marks which records are live inside
    its read section and scans them after it. The scan used to translate vids to ids through
    the live ``vid2ext`` array; an upsert whose version wrapped (the 128th rewrite of an id)
    retires the old vid and set ``vid2ext[vid] = -1`` in place, so a search that had just
    found the old vid live dropped the id. Ids are now translated inside the read section."""
    index, base = _small_index(tmp_path / "w")
    for _ in range(127):  # id 7 reaches version 127: its next upsert wraps
        index.upsert([7], base[7:8])
    with _paused_search(index, base[0], before_reading=False) as out:
        index.upsert([7], base[7:8])  # wraps: id 7 moves to a new vid, the old one retires
    index.close()
    got = out["res"].ids[0].tolist()
    assert sorted(got) == list(range(300)), f"missing {sorted(set(range(300)) - set(got))}"


# --- the checker itself: hand-made histories ---------------------------------------------------
def _v(token: int) -> np.ndarray:
    return np.array([[token, 0, 0, 0]], np.float32)


def _up(seq: int, x: int, token: int, start: int, end: int, ok: bool = True) -> Write:
    return Write(0, seq, "upsert", (x,), _v(token), start, end, ok)


def _del(seq: int, x: int, start: int, end: int) -> Write:
    return Write(0, seq, "delete", (x,), None, start, end)


def _get(x: int, token: int | None, start: int, end: int) -> Read:
    found = token is not None
    return Read(0, "get", start, end, np.array([x]), found=np.array([found]),
                vectors=_v(token if found else 0))


def _search(ids: list[int], dists: list[float], query: np.ndarray, start: int, end: int,
            complete: bool = False) -> Read:
    return Read(0, "search", start, end, np.array(ids), query=query[0],
                distances=np.array(dists, np.float32), complete=complete)


def rules(writes, reads) -> list[str]:
    return [v.rule for v in check_history(writes, reads)]


def test_checker_accepts_good_histories():
    writes = [_up(0, 1, 10, 0, 10), _up(1, 1, 11, 20, 30), _up(2, 1, 12, 25, 40),  # 11 and 12 overlap
              _del(3, 2, 0, 5), _up(4, 3, 13, 50, 200, ok=False)]                  # 13 failed
    reads = [
        _get(1, 10, 5, 15),       # during the first upsert... and after it: either way 10
        _get(1, 10, 15, 22),      # 11 began at 20, not done
        _get(1, 11, 31, 35),      # 11 done, 12 overlapped it and is not done: 11 or 12
        _get(1, 12, 31, 35),
        _get(1, 11, 41, 45),      # 11 and 12 overlapped: either order is allowed
        _get(1, 12, 41, 45),
        _get(2, None, 6, 7),      # deleted
        _get(3, None, 0, 1),      # initial state
        _get(3, 13, 300, 301),    # a failed write may have taken effect
        _get(3, None, 300, 301),  # or not
        _get(1, None, 0, 1),      # before the first write of id 1 completed
        # complete search from token 0: id 1 at distance 11^2, id 3 absent
        _search([1, -1], [121.0, np.inf], _v(0), 31, 35, complete=True),
    ]
    assert check_history(writes, reads) == []


def test_checker_catches_bad_histories():
    writes = [_up(0, 1, 10, 0, 10), _up(1, 1, 11, 20, 30), _del(2, 2, 0, 5), _up(3, 2, 20, 6, 8),
              _del(4, 3, 100, 110), _up(5, 3, 30, 50, 60)]
    # stale: a read starting after 11 completed sees 10, which finished before 11 began
    assert rules(writes, [_get(1, 10, 31, 35)]) == ["stale"]
    # ... also through a search distance, and as absence after an upsert completed
    assert rules(writes, [_search([1], [100.0], _v(0), 31, 35)]) == ["stale"]
    assert rules(writes, [_get(1, None, 31, 35)]) == ["stale"]
    # a complete search that misses ids 1 and 2 (id 3's first write has not begun: absent is right)
    got = check_history(writes, [_search([-1], [np.inf], _v(0), 31, 35, complete=True)])
    assert sorted((v.rule, v.id) for v in got) == [("stale", 1), ("stale", 2)]
    # deleted: id 3's delete completed at 110, its only upsert completed at 60, before the delete began
    assert rules(writes, [_get(3, 30, 120, 130)]) == ["deleted"]
    assert rules(writes, [_search([3], [900.0], _v(0), 120, 130)]) == ["deleted"]
    # an upsert overlapping the delete makes presence legal, with its value only
    overlap = writes + [_up(6, 3, 31, 105, 150)]
    assert rules(overlap, [_get(3, 31, 120, 130)]) == []
    assert rules(overlap, [_get(3, 30, 120, 130)]) == ["stale"]
    # unwritten: a vector never written to the id, one written only after the read ended, an
    # id never written at all, a distance no value of the id has
    assert rules(writes, [_get(1, 20, 31, 35)]) == ["unwritten"]
    assert rules(writes, [_get(1, 11, 5, 15)]) == ["unwritten"]
    assert rules(writes, [_get(7, 10, 5, 15)]) == ["unwritten"]
    assert rules(writes, [_search([1], [5.0], _v(0), 31, 35)]) == ["unwritten"]
    # duplicate ids in a search row
    assert rules(writes, [_search([1, 1], [121.0, 121.0], _v(0), 31, 35)]) == ["duplicate"]


def _reference(writes: list[Write], reads: list[Read]) -> set[tuple[str, int, int]]:
    """The rules of ``tests/history.py`` straight from their definitions, O(reads x writes)."""
    entries: dict[int, list[tuple]] = {}  # id -> (kind, token, start, end or +inf, ok, real)
    for w in writes:
        for j, x in enumerate(w.ids):
            token = int(w.vectors[j][0]) if w.kind == "upsert" else None
            entries.setdefault(x, [("delete", None, -np.inf, -np.inf, True, False)])
            entries[x].append((w.kind, token, w.start, w.end if w.ok else np.inf, w.ok, True))
    out = set()
    for ri, r in enumerate(reads):
        seen: dict[int, tuple] = {}
        if r.kind == "get":
            for x, f, v in zip(r.ids.tolist(), r.found.tolist(), r.vectors):
                seen[x] = ("value", int(v[0])) if f else ("absent",)
        else:
            row = [x for x in r.ids.tolist() if x >= 0]
            out |= {("duplicate", ri, x) for x in row if row.count(x) > 1}
            if r.complete:
                seen = {x: ("absent",) for x in entries}
            for x, d in zip(r.ids.tolist(), r.distances.tolist()):
                if x >= 0:
                    seen[x] = ("distance", d)
        for x, o in seen.items():
            if x not in entries:
                if o[0] != "absent":
                    out.add(("unwritten", ri, x))
                continue
            es = entries[x]

            def explains(e) -> bool:
                if o[0] == "absent":
                    return e[0] == "delete"
                if e[0] != "upsert":
                    return False
                return e[1] == o[1] if o[0] == "value" else float(np.float32(e[1] ** 2)) == o[1]

            cands = [e for e in es if e[2] < r.end and explains(e)]
            ups = [e for e in es if e[0] == "upsert" and e[2] < r.end]
            if o[0] != "absent" and any(d[0] == "delete" and d[5] and d[4] and d[3] < r.start
                                        and all(u[3] < d[2] for u in ups) for d in es):
                out.add(("deleted", ri, x))
            elif not cands:
                out.add(("unwritten", ri, x))
            elif all(any(w2[4] and w2[3] < r.start and c[3] < w2[2] for w2 in es) for c in cands):
                out.add(("stale", ri, x))
    return out


def test_checker_matches_its_definitions_on_random_histories():
    """The checker's indexed fast path and exact path against a direct reading of the rules."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        writes, tokens = [], []
        for seq in range(int(rng.integers(1, 14))):
            x = int(rng.integers(0, 4))
            start = int(rng.integers(0, 100))
            end = start + int(rng.integers(0, 30))
            ok = bool(rng.random() > 0.1)
            if rng.random() < 0.3:
                writes.append(Write(0, seq, "delete", (x,), None, start, end, ok))
            else:
                t = len(tokens) + 1
                tokens.append(t)
                writes.append(Write(0, seq, "upsert", (x,), _v(t), start, end, ok))
        reads = []
        for _ in range(int(rng.integers(1, 10))):
            start = int(rng.integers(0, 130))
            end = start + int(rng.integers(0, 20))
            pick = lambda: int(rng.choice(tokens)) if tokens and rng.random() < 0.8 else int(rng.integers(1, 40))
            if rng.random() < 0.5:
                x = int(rng.integers(0, 5))
                reads.append(_get(x, pick() if rng.random() < 0.6 else None, start, end))
            else:
                ids = [int(i) for i in rng.choice(5, int(rng.integers(0, 4)))]  # may repeat: duplicates
                reads.append(_search(ids, [float(pick() ** 2) for _ in ids], _v(0), start, end,
                                     complete=bool(rng.random() < 0.5)))
        got = {(v.rule, v.read, v.id) for v in check_history(writes, reads)}
        assert got == _reference(writes, reads), (writes, reads)
