"""PostingStore implementations: same semantics, RocksDB persists them."""
from __future__ import annotations

import itertools
import struct
import threading
import time

import numpy as np
import pytest

from vindex.errors import CorruptionError, StorageError
from vindex.storage import Change, IOClass, MemoryStore, records
from vindex.storage.rocks import RocksStore

from conftest import run_for

DIM = 4
RS = 4 * (DIM + 2)


def recs(vids, version=0):
    vids = np.asarray(vids)
    vecs = np.repeat(vids[:, None], DIM, axis=1).astype(np.float32)
    return records.encode(vids, np.full(vids.size, version), vecs).tobytes()


def read_vids(store, pids):
    batch = store.read(np.asarray(pids), IOClass.INTERACTIVE)
    _, words = records.view(batch.data, DIM)
    return [words[batch.offsets[i]:batch.offsets[i + 1], 0].tolist() for i in range(len(pids))]


@pytest.fixture(params=["memory", "rocksdb", "blocks"])
def store(request, tmp_path):
    if request.param == "memory":
        s = MemoryStore(RS)
    elif request.param == "rocksdb":
        s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True)
    else:
        from vindex.storage.blocks import BlockStore

        s = BlockStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True)
    yield s
    s.close()


def test_append_replace_drop(store):
    store.bulk_load(np.array([0, 1]), records.view(np.frombuffer(bytearray(recs([1, 2, 3])), np.uint8), DIM)[0],
                    np.array([0, 2, 3]))
    assert read_vids(store, [0, 1]) == [[1, 2], [3]]
    assert store.commit(Change(appends={0: recs([4]), 5: recs([9, 8])}, log=b"a"), IOClass.UPDATE) == 1
    assert store.commit(Change(appends={0: recs([5])}), IOClass.UPDATE) == 0  # no log record
    assert read_vids(store, [5, 0, 7]) == [[9, 8], [1, 2, 4, 5], []]
    assert store.lengths()[0] == 4 and store.lengths()[5] == 2
    store.commit(Change(replaces={0: recs([2])}, drops=[1], log=b"b"), IOClass.BACKGROUND)
    assert read_vids(store, [0, 1, 5]) == [[2], [], [9, 8]]
    assert store.commit(Change(appends={0: recs([6])}, log=b"c"), IOClass.UPDATE) == 3
    assert read_vids(store, [0]) == [[2, 6]]
    assert [s for s, _ in store.log_since(1)] == [2, 3]
    store.truncate_log(2)
    assert list(store.log_since(0)) == [(3, b"c")]


def test_rocks_state_survives_reopen(tmp_path):
    path = str(tmp_path / "db")
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={3: recs([1, 2])}, log=b"x"), IOClass.UPDATE)
    s.commit(Change(appends={3: recs([7])}, log=b"y"), IOClass.UPDATE)
    s.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    assert read_vids(s, [3]) == [[1, 2, 7]]
    assert s.lengths()[3] == 3
    assert list(s.log_since(0)) == [(1, b"x"), (2, b"y")]
    assert s.commit(Change(log=b"z"), IOClass.UPDATE) == 3  # sequence continues
    s.close()


def test_rocks_detects_torn_record(tmp_path):
    path = str(tmp_path / "db")
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={0: recs([1])}), IOClass.UPDATE)
    s._cf["postings"][struct.pack(">II", 0, 0)] = b"\x00" * (RS - 3)  # corrupt the chunk
    with pytest.raises(CorruptionError, match="not a whole number"):
        s.read(np.array([0]), IOClass.INTERACTIVE)
    s.close()


def test_rocks_large_commit_pauses_between_its_early_pieces(tmp_path):
    """The engine's pause (let running searches finish) runs after each early piece, with
    the pieces already written and the commit's own batch not yet."""
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True, early_write_keys=2)
    seen = []
    change = Change(appends={p: recs([p]) for p in range(5)}, log=b"a",
                    pause=lambda: seen.append((int(s.lengths().sum()), len(list(s.log_since(0))))))
    s.commit(change, IOClass.UPDATE)
    assert seen == [(0, 0)] * 3  # 5 postings in pieces of 2; nothing counted or logged yet
    assert read_vids(s, list(range(5))) == [[p] for p in range(5)]
    s.close()


def test_rocks_chunks_written_ahead_of_a_failed_commit_stay_invisible(tmp_path):
    """A large commit writes its appended chunks in pieces before its own batch (so the GIL
    is released between them). If the commit's batch never lands, those chunks lie past
    the directory's count: never read, and overwritten by the next append."""
    path = str(tmp_path / "db")
    # every commit of 2+ appends writes early
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True, early_write_keys=1)
    s.commit(Change(appends={0: recs([1]), 1: recs([2])}, log=b"a"), IOClass.UPDATE)

    class FailLastWrite:  # the early pieces land, the commit's own batch does not
        def __init__(self, db):
            self.db, self.writes = db, 0

        def __getattr__(self, name):
            return getattr(self.db, name)

        def write(self, batch, *a):
            self.writes += 1
            if self.writes == 3:
                raise Exception("IO error: No space left on device")
            return self.db.write(batch, *a)

    s._db = FailLastWrite(s._db)
    with pytest.raises(StorageError):
        s.commit(Change(appends={0: recs([7]), 1: recs([8])}, log=b"b"), IOClass.UPDATE)
    assert s._db.writes == 3
    s._db = s._db.db
    s.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    assert read_vids(s, [0, 1]) == [[1], [2]]  # the early chunks are not part of any posting
    assert [seq for seq, _ in s.log_since(0)] == [1]
    s.commit(Change(appends={0: recs([3]), 1: recs([4])}, log=b"c"), IOClass.UPDATE)
    s.commit(Change(replaces={1: recs([5])}, appends={0: recs([6])}, log=b"d"), IOClass.UPDATE)
    assert read_vids(s, [0, 1]) == [[1, 3, 6], [5]]
    s.close()


def test_rocks_replaces_written_ahead_of_a_failed_commit_leave_the_postings_as_they_were(tmp_path):
    """A large commit's replaces are written ahead too, to keys outside the postings' chunks:
    if its batch never lands, every posting reads as before, and later commits reuse the
    keys (including a posting replaced and appended to in one commit)."""
    path = str(tmp_path / "db")
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True, early_write_keys=1)
    s.commit(Change(appends={0: recs([1]), 1: recs([2]), 2: recs([9])}, log=b"a"), IOClass.UPDATE)
    s.commit(Change(appends={0: recs([3])}, log=b"b"), IOClass.UPDATE)
    real = s._db

    class FailBatch:  # early pieces land, the commit's own batch (with the log) does not
        def __getattr__(self, name):
            return getattr(real, name)

        def write(self, batch, *a):
            if len(batch) > 1:
                raise Exception("IO error: No space left on device")
            return real.write(batch, *a)

    s._db = FailBatch()
    with pytest.raises(StorageError):
        s.commit(Change(replaces={0: recs([7]), 1: recs([8])}, appends={2: recs([10])}, log=b"c"),
                 IOClass.UPDATE)
    assert read_vids(s, [0, 1, 2]) == [[1, 3], [2], [9]]
    s._db = real
    s.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    assert read_vids(s, [0, 1, 2]) == [[1, 3], [2], [9]]
    s.commit(Change(replaces={0: recs([4]), 1: recs([5])}, appends={1: recs([6]), 2: recs([11])}, log=b"d"),
             IOClass.UPDATE)
    s.commit(Change(appends={0: recs([12])}, log=b"e"), IOClass.UPDATE)
    s.commit(Change(replaces={0: recs([13])}, log=b"f"), IOClass.UPDATE)  # back to chunk 0
    assert read_vids(s, [0, 1, 2]) == [[13], [5, 6], [9, 11]]
    assert s.fragments(np.array([0, 1, 2])).tolist() == [1, 1, 2]
    s.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    assert read_vids(s, [0, 1, 2]) == [[13], [5, 6], [9, 11]]
    s.close()


def test_rocks_read_that_races_a_replace_reads_the_new_posting(tmp_path):
    """A replace moves a posting to new keys and deletes the old ones: a read that resolved
    the old keys and fetches after the commit finds them gone, and reads again."""
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={0: recs([1])}), IOClass.UPDATE)
    s.commit(Change(appends={0: recs([2])}), IOClass.UPDATE)
    fetch, fetched = s._multi_get, []

    def commit_first(keys, *io):
        if not fetched:
            s.commit(Change(replaces={0: recs([3, 4])}), IOClass.UPDATE)
        fetched.append(list(keys))
        return fetch(keys, *io)

    s._multi_get = commit_first
    assert read_vids(s, [0]) == [[3, 4]]
    assert len(fetched) == 2 and fetched[0] != fetched[1]
    s.close()


def test_rocks_refuses_a_chunk_that_is_not_whole_records_and_keeps_nothing_of_it(tmp_path):
    from rocksdict import Options, Rdict

    path = str(tmp_path / "db")
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={0: recs([1, 2]), 1: recs([3])}), IOClass.UPDATE)
    s.close()
    db = Rdict(path, Options(raw_mode=True), column_families={n: Options(raw_mode=True) for n in ("postings", "pdir", "log", "payload")})
    postings = db.get_column_family("postings")
    key = next(k for k in postings.keys() if struct.unpack(">II", k)[0] == 0)
    postings[key] = postings[key][:-3]  # torn: two records less three bytes
    del postings
    db.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    with pytest.raises(CorruptionError, match="not a whole number"):
        read_vids(s, [1, 0])
    assert not s._kept.entries()  # nothing of the failed read is kept
    assert read_vids(s, [1]) == [[3]]
    s.close()


def test_rocks_opens_a_directory_written_before_first_chunks(tmp_path):
    """Stores whose directory values are (chunks, records), without the first chunk, read as
    postings starting at chunk 0."""
    from rocksdict import Options, Rdict

    path = str(tmp_path / "db")
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={0: recs([1]), 5: recs([2])}), IOClass.UPDATE)
    s.commit(Change(appends={0: recs([3])}), IOClass.UPDATE)
    s.close()
    db = Rdict(path, Options(raw_mode=True), column_families={n: Options(raw_mode=True) for n in ("postings", "pdir", "log", "payload")})
    pdir = db.get_column_family("pdir")
    for key, value in list(pdir.items()):
        pdir[key] = value[:8]
    del pdir
    db.close()
    s = RocksStore(path, record_size=RS, cache_bytes=1 << 22, create=False)
    assert read_vids(s, [0, 5]) == [[1, 3], [2]]
    s.commit(Change(replaces={0: recs([4])}, appends={5: recs([6])}), IOClass.UPDATE)
    assert read_vids(s, [0, 5]) == [[4], [2, 6]]
    s.close()


def _counting(s):
    """Wrap ``s._multi_get`` to record how many keys each fetch asks for."""
    fetch, fetched = s._multi_get, []

    def counted(keys, *io):
        fetched.append(len(keys))
        return fetch(keys, *io)

    s._multi_get = counted
    return fetched


def test_rocks_rereads_only_the_chunks_appended_since_a_posting_was_read(tmp_path):
    """What a read found is kept: the next read fetches only the chunks appended since (none
    if there are none), and gives the same bytes as a full read."""
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={0: recs([1]), 1: recs([10])}), IOClass.UPDATE)
    for v in (2, 3, 4):
        s.commit(Change(appends={0: recs([v])}), IOClass.UPDATE)
    fetched = _counting(s)
    assert read_vids(s, [0, 1]) == [[1, 2, 3, 4], [10]]
    assert read_vids(s, [0, 1]) == [[1, 2, 3, 4], [10]]
    s.commit(Change(appends={0: recs([5]), 1: recs([11])}), IOClass.UPDATE)
    assert read_vids(s, [1, 0]) == [[10, 11], [1, 2, 3, 4, 5]]
    assert fetched == [5, 1 + 1]  # the second read fetched nothing
    # a replace (or a drop) moves the posting: what was learnt of it is not used again
    s.commit(Change(replaces={0: recs([6])}), IOClass.BACKGROUND)
    s.commit(Change(appends={0: recs([7])}), IOClass.UPDATE)
    s.commit(Change(replaces={0: recs([8])}), IOClass.BACKGROUND)
    s.commit(Change(appends={0: recs([9])}), IOClass.UPDATE)
    s.commit(Change(appends={0: recs([12])}), IOClass.UPDATE)
    assert read_vids(s, [0]) == [[8, 9, 12]]
    s.commit(Change(drops=[1]), IOClass.BACKGROUND)
    s.commit(Change(appends={1: recs([13])}), IOClass.UPDATE)
    s.commit(Change(appends={1: recs([14])}), IOClass.UPDATE)
    assert read_vids(s, [1, 0]) == [[13, 14], [8, 9, 12]]
    assert fetched[-2:] == [3, 2]  # posting 0 moved, then posting 1 (posting 0 kept since)
    assert s.stats()["kept_bytes"] == sum(t[3] for t in s._kept.entries().values()) * RS > 0
    s.close()


def test_rocks_kept_postings_stay_within_their_share_of_the_cache(tmp_path):
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=8 * RS, create=True)
    for v in range(6):
        s.commit(Change(appends={0: recs([v]), 1: recs([100 + v])}), IOClass.UPDATE)
        assert read_vids(s, [0, 1]) == [list(range(v + 1)), [100 + w for w in range(v + 1)]]
        assert s._kept.live_bytes <= 2 * RS
        assert s._kept.live_bytes == sum(t[3] for t in s._kept.entries().values()) * RS
    s.close()


def test_rocks_keeps_whole_postings_while_there_is_room_then_only_tails(tmp_path):
    """Whole postings that searches read fill the share but never push older ones out; once
    it is full, a posting in several chunks keeps what follows its first chunk and pushes the
    oldest out (those chunks are the keys a read saves); one in one chunk is not kept."""
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=8 * RS, create=True)  # share: 2 records
    s.commit(Change(appends={p: recs([p]) for p in range(3)}), IOClass.UPDATE)
    s.read(np.arange(3), IOClass.BACKGROUND)
    assert not s._kept.entries()  # whole postings are kept from searches only
    assert read_vids(s, [0, 1, 2]) == [[0], [1], [2]]
    assert list(s._kept.entries()) == [0, 1] and s._kept.live_bytes == 2 * RS  # no room for posting 2
    s.commit(Change(appends={2: recs([3])}), IOClass.UPDATE)
    assert read_vids(s, [2]) == [[2, 3]]
    kept = s._kept.entries()
    assert list(kept) == [1, 2] and s._kept.live_bytes == 2 * RS and not kept[2][2]  # 2's tail pushed 0 out
    assert not s._kept.keep_whole  # and no whole posting is kept from now on
    fetched = _counting(s)
    assert read_vids(s, [2, 1, 0]) == [[2, 3], [1], [0]]
    assert fetched == [2]  # posting 2's first chunk and posting 0; posting 1 whole from memory
    # a posting kept whole that grew is kept whole again (the newest), not read as
    # "kept part + every chunk appended since" from then on
    s.commit(Change(appends={1: recs([4])}), IOClass.UPDATE)
    assert read_vids(s, [1]) == [[1, 4]] and read_vids(s, [1]) == [[1, 4]]
    assert fetched == [2, 1]  # the appended chunk, once
    kept = s._kept.entries()
    assert list(kept)[-1] == 1 and kept[1][2] and s._kept.live_bytes <= 2 * RS
    s.close()


def _commit_during_first_fetch(s, change):
    """Make ``s`` commit ``change`` between resolving its first read's keys and fetching
    them; returns the list of keys each fetch asks for (``del s._multi_get`` undoes it)."""
    fetch, fetched = s._multi_get, []

    def commit_first(keys, *io):
        if not fetched:
            s.commit(change, IOClass.UPDATE)
        fetched.append(len(keys))
        return fetch(keys, *io)

    s._multi_get = commit_first
    return fetched


@pytest.mark.parametrize("kind", ["appends", "replaces", "drops"])
@pytest.mark.parametrize("held", ["whole", "tail"])
def test_rocks_read_that_races_a_commit_to_a_posting_it_knows_reads_it_right(tmp_path, kind, held):
    """A read that took a posting's chunks from memory (the whole posting, or what follows
    its first chunk when the share is full) while a commit changed the posting returns the
    posting as it was or as the commit left it, never a mix."""
    share = {"whole": 1 << 22, "tail": 4 * RS}[held]  # a quarter: room for the whole posting, or not
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=share, create=True)
    s.commit(Change(appends={0: recs([1]), 1: recs([5])}), IOClass.UPDATE)
    s.commit(Change(appends={0: recs([2])}), IOClass.UPDATE)
    assert read_vids(s, [0]) == [[1, 2]]
    assert s._kept.entries()[0][2] == (held == "whole")
    s.commit(Change(appends={0: recs([3])}), IOClass.UPDATE)
    change = {"appends": Change(appends={0: recs([9])}), "replaces": Change(replaces={0: recs([9])}),
              "drops": Change(drops=[0])}[kind]
    fetched = _commit_during_first_fetch(s, change)
    got = read_vids(s, [0, 1])
    # posting 0's newest chunk (and its first, if only its tail is held), posting 1's chunk
    assert fetched[0] == {"whole": 2, "tail": 3}[held]
    assert got in {"appends": [[[1, 2, 3], [5]]], "replaces": [[[9], [5]]], "drops": [[[], [5]]]}[kind]
    del s._multi_get
    assert read_vids(s, [0]) == {"appends": [[1, 2, 3, 9]], "replaces": [[9]], "drops": [[]]}[kind]
    s.close()


def test_rocks_large_read_that_meets_a_commit_fetches_again_only_what_it_moved(tmp_path):
    """A read of many postings during which a commit moved some of them fetches again only
    those; every posting comes back as it was before the commit or after, never a mix."""
    from vindex.storage import rocks

    n = rocks.REREAD_MOVED_MIN + 36
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 22, create=True)
    s.commit(Change(appends={p: recs([10 * p]) for p in range(n)}), IOClass.UPDATE)
    s.commit(Change(appends={p: recs([10 * p + 1]) for p in range(n)}), IOClass.UPDATE)
    change = Change(replaces={3: recs([900])}, drops=[7], appends={11: recs([901])})
    fetched = _commit_during_first_fetch(s, change)
    got = read_vids(s, range(n))
    assert fetched == [2 * n, 1]  # then posting 3's one new chunk (posting 7 has none)
    before = [[10 * p, 10 * p + 1] for p in range(n)]
    after = [list(v) for v in before]
    after[3], after[7], after[11] = [900], [], before[11] + [901]
    assert got[3] == [900] and got[7] == [] and got[11] in (before[11], after[11])
    assert [g for p, g in enumerate(got) if p not in (3, 7, 11)] == [b for p, b in enumerate(before) if p not in (3, 7, 11)]
    del s._multi_get
    assert read_vids(s, range(n)) == after
    s.close()


def test_rocks_background_reads_leave_the_block_cache_to_searches(tmp_path):
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=1 << 24, create=True)
    s.commit(Change(appends={p: recs(range(10 * p, 10 * p + 10)) for p in range(200)}), IOClass.UPDATE)
    s._cf["postings"].flush()  # to table files: memtable reads never touch the block cache
    before = s._cache.get_usage()
    assert s.read(np.arange(200), IOClass.BACKGROUND).offsets[-1] == 2000
    assert s._cache.get_usage() == before
    s.read(np.arange(200), IOClass.INTERACTIVE)
    assert s._cache.get_usage() > before + 200 * 10 * RS
    s.close()


def _rows(n, first):
    """``n`` records of vids ``first..`` as bytes."""
    return recs(range(first, first + n))


def test_kept_ring_evicts_oldest_first_and_never_wraps_an_entry():
    from vindex.storage.kept import KeptPostings

    k = KeptPostings(10 * RS, RS)
    assert k.keep([(p, 1, 0, True, _rows(3, 10 * p)) for p in range(4)], evict=False) == [True, True, True, False]
    assert list(k.entries()) == [0, 1, 2] and k.live_bytes == 9 * RS
    assert k.keep([(3, 1, 0, False, _rows(3, 30))], evict=True) == [True]  # rows 0-2 again: 0 goes
    assert list(k.entries()) == [1, 2, 3] and not k.keep_whole
    assert k.keep([(4, 1, 0, False, _rows(11, 40))], evict=True) == [False]  # larger than the ring
    found, token = k.find(np.array([3, 0, 2, 99]))
    assert found[1, 0] == -1 and found[3, 0] == -1 and token
    views = {p: k.view(int(found[i, 0]), int(found[i, 1])) for i, p in ((0, 3), (2, 2))}
    assert views[3][:, 0].tolist() == [30, 31, 32] and views[2][:, 0].tolist() == [20, 21, 22]
    k.release(token)


def test_kept_ring_stops_keeping_whole_postings_while_they_do_not_fit_and_starts_again():
    from vindex.storage.kept import KeptPostings

    k = KeptPostings(4 * RS, RS)
    k.keep([(0, 1, 0, True, _rows(2, 0)), (1, 1, 0, True, _rows(2, 10))], evict=False)
    k.keep([(2, 2, 0, False, _rows(1, 20))], evict=True)  # pushes posting 0 out, the ring full
    assert not k.keep_whole and list(k.entries()) == [1, 2]
    k.keep([(2, 2, 0, False, _rows(1, 21))], evict=True)  # replaces 2's entry: as full as before
    assert not k.keep_whole
    k.keep([(2, 2, 0, False, _rows(1, 22))], evict=True)  # pushes posting 1 out: a quarter in use
    assert k.keep_whole and list(k.entries()) == [2] and k.live_bytes == RS


def test_kept_ring_grows_without_copying_its_records():
    # growing by copying into a larger array held up the search whose keep triggered it
    # for as long as the copy took; the array is reserved once and the ring's end moves on
    from vindex.storage.kept import KeptPostings

    k = KeptPostings(64 * RS, RS, initial_bytes=4 * RS)
    rows = k.rows
    assert k.allocated_bytes == 4 * RS
    for pid in range(8):  # 24 rows, all in use: the ring grows past 4 rows
        assert k.keep([(pid, 1, 0, True, _rows(3, 10 * pid))], evict=False) == [True]
    assert k.rows is rows and 24 * RS <= k.allocated_bytes <= 64 * RS
    found, token = k.find(np.arange(8))
    assert [k.view(int(r[0]), 3)[:, 0].tolist() for r in found] == [[10 * p, 10 * p + 1, 10 * p + 2] for p in range(8)]
    k.release(token)


def test_kept_ring_never_overwrites_rows_a_reader_holds():
    from vindex.storage.kept import KeptPostings

    k = KeptPostings(6 * RS, RS)
    k.keep([(0, 1, 0, True, _rows(3, 0)), (1, 1, 0, True, _rows(3, 10))], evict=False)
    found, token = k.find(np.array([0]))  # a search scanning posting 0 in place
    assert k.keep([(2, 1, 0, False, _rows(2, 20))], evict=True) == [False]  # would overwrite posting 0
    assert k.view(int(found[0, 0]), 3)[:, 0].tolist() == [0, 1, 2]
    k.release(token)
    assert k.keep([(2, 1, 0, False, _rows(2, 20))], evict=True) == [True]
    assert list(k.entries()) == [1, 2]
    k.release(token)  # a second release is harmless


def test_rocks_search_reads_kept_postings_in_place_and_holds_them_until_released(tmp_path):
    """A search's read leaves postings kept whole and unchanged where they are kept; other
    reads meanwhile cannot overwrite them, and the rows read are what a full read returns."""
    s = RocksStore(str(tmp_path / "db"), record_size=RS, cache_bytes=16 * RS, create=True)  # share: 4 records
    s.commit(Change(appends={0: recs([1, 2]), 1: recs([3]), 2: recs([4])}), IOClass.UPDATE)
    s.commit(Change(appends={2: recs([5])}), IOClass.UPDATE)
    assert read_vids(s, [0, 1, 2]) == [[1, 2], [3], [4, 5]]  # 0 and 1 kept whole, 2 has no room
    batch = s.read(np.array([2, 0, 1]), IOClass.INTERACTIVE, in_place=True)
    held = batch.in_place
    assert held.index.tolist() == [1, 2]  # 0 and 1 in place; 2 read into the buffer
    assert [held.rows[a:b, 0].tolist() for a, b in zip(held.starts, held.ends)] == [[1, 2], [3]]
    _, words = records.view(batch.data, DIM)
    assert words[:, 0].tolist() == [4, 5] and batch.offsets.tolist() == [0, 2]
    for v in range(6, 12):  # tails that would push 0 and 1 out
        s.commit(Change(appends={2: recs([v])}), IOClass.UPDATE)
        read_vids(s, [2])
    assert [held.rows[a:b, 0].tolist() for a, b in zip(held.starts, held.ends)] == [[1, 2], [3]]
    held.release()
    s.commit(Change(appends={2: recs([12])}), IOClass.UPDATE)
    assert read_vids(s, [2]) == [list(range(4, 13))]
    assert 2 in s._kept.entries()  # kept once nothing held the rows
    s.close()


def test_kept_ring_under_threads_never_changes_an_entry_a_reader_holds():
    """Threads keeping entries (the ring small, so it wraps and grows) while others find and
    hold them: every entry found reads as it was kept until its reader releases it."""
    from vindex.storage.kept import ROWS, SPAN, START, KeptPostings

    rs = 16
    k = KeptPostings(40 * rs, rs, initial_bytes=8 * rs)  # 8 rows, growing to 40
    stamp = itertools.count(1)
    errors, stop = [], threading.Event()

    def keeper(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            batch = []
            for _ in range(rng.integers(1, 4)):
                n, value = int(rng.integers(1, 6)), next(stamp)
                batch.append((int(rng.integers(0, 30)), value, 0, True,
                              np.full(n * rs // 4, value, np.uint32).tobytes()))
            k.keep(batch, evict=bool(rng.integers(0, 2)))

    def reader(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            found, token = k.find(rng.choice(30, 5, replace=False).astype(np.int64))
            try:
                rows = [(int(r[START]), int(r[ROWS]), int(r[SPAN])) for r in found if r[START] >= 0]
                for _ in range(3):
                    for start, n, value in rows:
                        got = k.view(start, n)
                        if got.shape[0] != n or (got != value).any():
                            errors.append((start, n, value, got.ravel()[:4].tolist()))
                    time.sleep(0)
            finally:
                k.release(token)

    threads = [threading.Thread(target=keeper, args=(s,)) for s in (1, 2)]
    threads += [threading.Thread(target=reader, args=(s,)) for s in (3, 4)]
    run_for(threads, 1.5, stop)
    assert not errors, errors[:3]
    assert next(stamp) > 100 and k.live_rows <= 40 and k.allocated_bytes > 8 * rs
