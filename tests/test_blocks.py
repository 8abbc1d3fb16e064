"""The block store (store="blocks"): congruence with MemoryStore, crash recovery, corruption,
block reclamation against running reads, per-class queues, both I/O engines. The generic
store semantics run on it in test_store.py too."""
from __future__ import annotations

import errno
import gc
import glob
import io
import multiprocessing
import os
import shutil
import signal
import threading
import time
import zlib

import numpy as np
import pytest
from conftest import wait_until

from vindex.errors import CorruptionError, IndexLockedError, StorageError
from vindex.errors import DeadlineExpired
from vindex.storage import Change, IOClass, MemoryStore, allocator, blockmap, blockplan, blocks, datafile, diskio
from vindex.storage.blockmap import BLOCK, BlockMap, FormatError
from vindex.storage.blocks import BlockStore
from vindex.storage.datafile import DataFile
from vindex.storage.tails import TailCache

RS = 24  # does not divide 4096: records straddle blocks


def _uring_works() -> bool:
    try:
        from vindex.storage.uring import Ring

        Ring().close()
        return True
    except OSError:
        return False


ENGINES = ["preadv", pytest.param("io_uring", marks=pytest.mark.skipif(not _uring_works(), reason="no io_uring"))]


@pytest.fixture(params=ENGINES)
def engine(request):
    return request.param


def recs(vids, rs: int = RS) -> bytes:
    """Records whose first u32 is the vid (the rest: the vid again, so damage shows)."""
    vids = np.asarray(vids, dtype=np.uint32)
    return np.repeat(vids[:, None], rs // 4, axis=1).tobytes()


def vids_of(store, pids, io=IOClass.INTERACTIVE, **kw):
    batch = store.read(np.asarray(pids), io, **kw)
    words = batch.data.view(np.uint32).reshape(-1, RS // 4)
    assert (words == words[:, :1]).all(), "a record came back damaged"
    return [words[batch.offsets[i]:batch.offsets[i + 1], 0].tolist() for i in range(len(pids))]


def open_store(path, **kw) -> BlockStore:
    kw.setdefault("create", True)
    return BlockStore(str(path), record_size=kw.pop("record_size", RS), **kw)


def load(store, postings: dict[int, list[int]]) -> None:
    pids = sorted(postings)
    data = np.frombuffer(b"".join(recs(postings[p], store.record_size) for p in pids), np.uint8)
    offsets = np.concatenate(([0], np.cumsum([len(postings[p]) for p in pids])))
    store.bulk_load(np.array(pids), data.reshape(-1, store.record_size), offsets)


def map_blocks(store) -> set[int]:
    return set(store._map.referenced().tolist())


def block_workers(store, pool):
    """Occupy every worker of a preadv pool (a class, or None: fifo's shared pool) until the
    returned event is set."""
    gate = threading.Event()
    blockers = [store._sched.submit(pool or IOClass.INTERACTIVE, gate.wait)
                for _ in range(store._sched._slots[pool])]
    wait_until(lambda: all(b.running() for b in blockers))
    return gate


# --- congruence with MemoryStore -----------------------------------------------------------------
def _same(blk, mem, pids, io=IOClass.INTERACTIVE):
    a, b = blk.read(pids, io), mem.read(pids, io)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    assert a.data.tobytes() == b.data.tobytes()


@pytest.mark.parametrize("rs", [24, 520, 4104])  # straddling, vector-sized, bigger than a block
def test_random_changes_match_memory_store(tmp_path, engine, rs):
    rng = np.random.default_rng(rs)
    n_max = 200 if rs < 1000 else 12

    def payload(n):
        return rng.integers(0, 256, n * rs, dtype=np.uint8).tobytes()

    mem, blk = MemoryStore(rs), open_store(tmp_path / "s", record_size=rs, engine=engine)
    sizes = rng.integers(0, n_max, 30)
    raw = np.frombuffer(payload(int(sizes.sum())), np.uint8).reshape(-1, rs)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    for s in (mem, blk):
        s.bulk_load(np.arange(30), raw, offsets)
    try:
        for step in range(160):
            ch = Change()
            for _ in range(int(rng.integers(1, 4))):
                pid, kind = int(rng.integers(0, 40)), rng.random()
                if kind < 0.6:
                    ch.appends[pid] = payload(int(rng.integers(1, n_max // 3 + 2)))
                elif kind < 0.85:
                    ch.replaces[pid] = payload(int(rng.integers(0, n_max)))
                else:
                    ch.drops.append(pid)
            ch.log = b"step %d" % step if rng.random() < 0.7 else None
            assert blk.commit(ch, IOClass.UPDATE) == mem.commit(ch, IOClass.UPDATE)
            if step % 10 == 0:
                _same(blk, mem, rng.permutation(45)[: int(rng.integers(1, 45))])
            if step % 23 == 0:
                blk.sync()  # makes released blocks reusable
            if step == 80:
                blk.close()
                blk = open_store(tmp_path / "s", record_size=rs, engine=engine, create=False)
            if step == 120:
                seq = mem._seq
                blk.truncate_log(seq - 3)
                mem.truncate_log(seq - 3)
        _same(blk, mem, rng.permutation(45), IOClass.BACKGROUND)
        n = max(blk.lengths().shape[0], mem.lengths().shape[0])
        np.testing.assert_array_equal(np.pad(blk.lengths(), (0, n - blk.lengths().shape[0])),
                                      np.pad(mem.lengths(), (0, n - mem.lengths().shape[0])))
        assert list(blk.log_since(0)) == list(mem.log_since(0))
        st = blk.stats()
        assert st["blocks_used"] == len(map_blocks(blk))
        assert st["blocks_held"] + st["blocks_used"] + len(blk._map.free) == blk._map.high
    finally:
        blk.close()


def test_concurrent_readers_see_whole_postings(tmp_path, engine):
    """Readers never see a block reused under them while a writer churns and syncs."""
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {p: list(range(p * 1000, p * 1000 + 50)) for p in range(8)})
    stop, errors = threading.Event(), []

    def reader(seed):
        rng = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                pids = rng.permutation(8)[:4]
                for p, got in zip(pids.tolist(), vids_of(s, pids)):
                    assert got == list(range(p * 1000, p * 1000 + len(got)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    rng = np.random.default_rng(0)
    lengths = {p: 50 for p in range(8)}
    for i in range(300):
        p = int(rng.integers(0, 8))
        if rng.random() < 0.3:
            lengths[p] = int(rng.integers(0, 400))
            s.commit(Change(replaces={p: recs(range(p * 1000, p * 1000 + lengths[p]))}), IOClass.BACKGROUND)
        else:
            n = int(rng.integers(1, 60))
            s.commit(Change(appends={p: recs(range(p * 1000 + lengths[p], p * 1000 + lengths[p] + n))}),
                     IOClass.UPDATE)
            lengths[p] += n
        if i % 10 == 0:
            s.sync()
    stop.set()
    for t in threads:
        t.join()
    s.close()
    assert not errors, errors[0]


# --- reopen and crashes ----------------------------------------------------------------------------
def test_reopen_after_close_and_from_a_copy_taken_while_open(tmp_path, engine):
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {0: list(range(300)), 1: [7]})
    for i in range(20):
        s.commit(Change(appends={i % 3: recs(range(1000 + 10 * i, 1010 + 10 * i))}, log=b"%d" % i), IOClass.UPDATE)
    s.commit(Change(replaces={1: recs([5, 6])}, drops=[2], log=b"last"), IOClass.UPDATE)
    want = vids_of(s, [0, 1, 2])
    shutil.copytree(tmp_path / "s", tmp_path / "copy")  # as a crash would leave it: no close, no sync
    s.close()
    for path in (tmp_path / "s", tmp_path / "copy"):
        again = open_store(path, engine=engine, create=False)
        assert vids_of(again, [0, 1, 2]) == want
        assert [r for _, r in again.log_since(18)] == [b"18", b"19", b"last"]
        assert again.commit(Change(log=b"next"), IOClass.UPDATE) == 22
        again.close()


def _child_commits(path: str, conn) -> None:
    """Spawned child: commits forever, reporting each (i, seq) once commit has returned."""
    s = BlockStore(path, record_size=RS, create=True)
    i = 0
    while True:
        seq = s.commit(Change(appends={i % 7: recs([i])}, log=b"%d" % i), IOClass.UPDATE)
        conn.send((i, seq))
        i += 1


def test_sigkill_loses_no_reported_commit(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=_child_commits, args=(str(tmp_path / "s"), theirs), daemon=True)
    child.start()
    reported = []
    try:
        while len(reported) < 300:
            if not ours.poll(120):
                raise TimeoutError("child reported nothing")
            reported.append(ours.recv())
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    try:
        while ours.poll(0):
            reported.append(ours.recv())
    except (EOFError, OSError):
        pass
    s = open_store(tmp_path / "s", create=False)
    got = vids_of(s, list(range(7)))
    logs = dict(s.log_since(0))
    for i, seq in reported:
        assert i in got[i % 7]
        assert logs[seq] == b"%d" % i
    assert sorted(logs) == list(range(1, len(logs) + 1))  # gapless, maybe a few unreported
    s.close()


# --- damaged logs and snapshots --------------------------------------------------------------------
def _record_starts(log_path) -> list[int]:
    data = open(log_path, "rb").read()
    starts, pos = [], blockmap.LOG_HEAD.size
    while pos < len(data):
        starts.append(pos)
        pos += 8 + int.from_bytes(data[pos:pos + 4], "little")
    return starts


def _three_commits(path):
    """Three commits as a crash leaves them: close's final record (which says everything is
    synced) cut off."""
    s = open_store(path)
    for i in range(3):
        s.commit(Change(appends={0: recs([i])}, log=b"r%d" % i), IOClass.UPDATE)
    s.close()
    (log_path,) = glob.glob(str(path / "log.*"))
    starts = _record_starts(log_path)
    assert len(starts) == 4
    os.truncate(log_path, starts[3])
    return log_path, starts[:3]


def _patch(path, offset, fn):
    data = bytearray(open(path, "rb").read())
    data = fn(data, offset)
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("damage", ["cut", "flip", "zeros"])
def test_torn_final_log_record_is_discarded(tmp_path, damage):
    log_path, starts = _three_commits(tmp_path / "s")
    size = os.path.getsize(log_path)
    if damage == "cut":
        os.truncate(log_path, size - 5)
    elif damage == "flip":
        _patch(log_path, size - 2, lambda d, o: d[:o] + bytes([d[o] ^ 0xFF]) + d[o + 1:])
    else:  # header written, payload pages never reached the disk
        _patch(log_path, starts[2] + 8, lambda d, o: d[:o] + bytes(len(d) - o))
    s = open_store(tmp_path / "s", create=False)
    assert vids_of(s, [0]) == [[0, 1]]
    assert os.path.getsize(log_path) == starts[2]  # cut away
    assert s.commit(Change(appends={0: recs([9])}, log=b"again"), IOClass.UPDATE) == 3
    s.close()
    s = open_store(tmp_path / "s", create=False)
    assert vids_of(s, [0]) == [[0, 1, 9]] and [r for _, r in s.log_since(0)] == [b"r0", b"r1", b"again"]
    s.close()


def test_damaged_middle_record_raises_corruption(tmp_path):
    log_path, starts = _three_commits(tmp_path / "s")
    _patch(log_path, starts[1] + 20, lambda d, o: d[:o] + bytes([d[o] ^ 0x01]) + d[o + 1:])
    with pytest.raises(CorruptionError, match=r"log\.\d+.*intact records follow"):
        open_store(tmp_path / "s", create=False)


def test_missing_middle_record_raises_corruption(tmp_path):
    log_path, starts = _three_commits(tmp_path / "s")
    _patch(log_path, starts[1], lambda d, o: d[:o] + d[starts[2]:])
    with pytest.raises(CorruptionError, match=r"log\.\d+: record 2 is missing"):
        open_store(tmp_path / "s", create=False)


def test_damaged_snapshot_or_short_data_file_raise_corruption(tmp_path):
    s = open_store(tmp_path / "s")
    load(s, {0: list(range(500))})
    s.close()
    (snap,) = glob.glob(str(tmp_path / "s" / "map.*"))
    good = open(snap, "rb").read()
    _patch(snap, 60, lambda d, o: d[:o] + bytes([d[o] ^ 0x10]) + d[o + 1:])
    with pytest.raises(CorruptionError, match=r"map\.\d+: snapshot fails its checksum"):
        open_store(tmp_path / "s", create=False)
    with open(snap, "wb") as f:
        f.write(good)
    os.truncate(tmp_path / "s" / "data", BLOCK)
    with pytest.raises(CorruptionError, match=r"data file .*data: the map points at block"):
        open_store(tmp_path / "s", create=False)


# --- damaged data blocks ---------------------------------------------------------------------------
def _rewrite_blocks(path, fn, *blocks):
    """Replace data blocks ``blocks`` of a closed store by ``fn(list of their bytes)``."""
    with open(path, "r+b") as f:
        old = []
        for b in blocks:
            f.seek(b * BLOCK)
            old.append(bytearray(f.read(BLOCK)))
        for b, data in zip(blocks, fn(old)):
            f.seek(b * BLOCK)
            f.write(data)


def _flip(byte, bit=0):
    def fn(old):
        old[0][byte] ^= 1 << bit
        return old
    return fn


@pytest.mark.parametrize("damage", ["flip", "zero", "swap"])
def test_damaged_data_block_raises_corruption_naming_the_file(tmp_path, engine, damage):
    """One bit flipped in a tail block an append wrote, a block zeroed, two blocks of a posting
    swapped: reading the posting raises CorruptionError naming the data file, the block and
    the posting; the other postings still read, before and after a reopen."""
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {0: list(range(500)), 1: list(range(1000, 1400)), 2: [7, 8]})
    s.commit(Change(appends={1: recs(range(1400, 1450))}), IOClass.UPDATE)  # two blocks kept, tail rewritten
    want = vids_of(s, [0, 1, 2])
    b1 = s._map.get(1).blocks.tolist()
    assert len(b1) == 3
    s.close()
    data = tmp_path / "s" / "data"
    if damage == "flip":
        _rewrite_blocks(data, _flip(1234, 5), b1[2])
        bad, nth = b1[2], 3
    elif damage == "zero":
        _rewrite_blocks(data, lambda old: [bytes(BLOCK)], b1[0])
        bad, nth = b1[0], 1
    else:
        _rewrite_blocks(data, lambda old: old[::-1], b1[0], b1[1])
        bad, nth = b1[0], 1
    message = (rf"data file {data}: block {bad} of posting 1 fails its checksum "
               rf"\(file offset {bad * BLOCK}, the posting's block {nth} of 3\)")
    s = open_store(tmp_path / "s", engine=engine, create=False)
    try:
        assert vids_of(s, [0, 2]) == [want[0], want[2]]
        for io_ in (IOClass.INTERACTIVE, IOClass.BACKGROUND):  # searches and gets; rebalancing
            with pytest.raises(CorruptionError, match=message):
                s.read(np.array([0, 1, 2]), io_)
        if damage == "flip":  # an append reads the damaged tail: refused, nothing applied
            with pytest.raises(CorruptionError, match=message):
                s.commit(Change(appends={1: recs([9]), 2: recs([9])}, log=b"x"), IOClass.UPDATE)
            assert s.lengths()[1] == 450 and s.lengths()[2] == 2 and list(s.log_since(0)) == []
        else:  # the tail is intact: the append works, the kept blocks keep their checksums
            s.commit(Change(appends={1: recs([9])}), IOClass.UPDATE)
            with pytest.raises(CorruptionError, match=rf"block {bad} of posting 1 fails its checksum"):
                s.read(np.array([1]), IOClass.INTERACTIVE)
        s.commit(Change(appends={2: recs([10])}), IOClass.UPDATE)
        assert vids_of(s, [0, 2]) == [want[0], want[2] + [10]]
        s.commit(Change(replaces={1: recs([4, 5])}), IOClass.UPDATE)  # a replace writes fresh blocks
        assert vids_of(s, [1]) == [[4, 5]]
    finally:
        s.close()
    s = open_store(tmp_path / "s", engine=engine, create=False)
    assert vids_of(s, [0, 1, 2]) == [want[0], [4, 5], want[2] + [10]]
    s.close()


def test_damaged_slack_and_unused_blocks(tmp_path):
    """The checksum covers a tail block's slack too (damage is damage); a block the map does
    not point at (released) is never read, so damage there costs nothing."""
    s = open_store(tmp_path / "s")
    load(s, {0: list(range(200)), 1: list(range(300))})  # posting 0: 4800 bytes, tail 704 used
    b0 = s._map.get(0).blocks.tolist()
    s.commit(Change(replaces={1: recs([1])}), IOClass.UPDATE)  # posting 1's old blocks are unused
    free = sorted(set(range(s._map.high)) - map_blocks(s))
    s.close()
    _rewrite_blocks(tmp_path / "s" / "data", _flip(4000), b0[1])
    _rewrite_blocks(tmp_path / "s" / "data", lambda old: [bytes(BLOCK)], free[0])
    s = open_store(tmp_path / "s", create=False)
    assert vids_of(s, [1]) == [[1]]
    with pytest.raises(CorruptionError, match=rf"block {b0[1]} of posting 0 fails its checksum"):
        s.read(np.array([0]), IOClass.INTERACTIVE)
    s.close()


def test_old_format_store_is_refused(tmp_path):
    s = open_store(tmp_path / "s")
    load(s, {0: [1, 2]})
    s.close()
    (snap,) = glob.glob(str(tmp_path / "s" / "map.*"))
    data = bytearray(open(snap, "rb").read())
    data[:8] = b"VXBMAP01"  # as a store written before the checksums (its CRC intact)
    data[-4:] = zlib.crc32(bytes(data[:-4])).to_bytes(4, "little")
    open(snap, "wb").write(bytes(data))
    with pytest.raises(CorruptionError, match=r"map\.\d+: snapshot of format 01, written before data "
                                              r"blocks had checksums.*rebuild the index"):
        open_store(tmp_path / "s", create=False)


# --- power loss: the log reached the disk, the data blocks it names did not ------------------------
def _crash_image(tmp_path, src, name):
    """A copy of an open store as a crash leaves it (no close, no sync)."""
    shutil.copytree(src, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize("lost", ["unsynced", "synced"])
def test_power_loss_cuts_the_log_before_commits_whose_data_was_lost(tmp_path, caplog, lost):
    """The log is a buffered file and the data O_DIRECT writes that may sit in the disk's
    volatile cache: a power loss can keep a log record whose blocks never landed. Opening
    reads back the blocks of commits after the last one known synced and ends the log before
    the first whose data is gone, so the store is the state of an earlier moment, never one
    that fails a read. Blocks of a synced commit are not re-checked: damage there is damage,
    raised when read."""
    s = open_store(tmp_path / "s")
    load(s, {0: list(range(300)), 1: [7]})
    s.commit(Change(appends={0: recs([1000])}, log=b"a"), IOClass.UPDATE)
    a_blocks = s._map.get(0).blocks[-1:].tolist()  # the tail block commit a rewrote
    s.sync()
    before = map_blocks(s)
    s.commit(Change(appends={1: recs(range(2000, 2400))}, log=b"b"), IOClass.UPDATE)
    b_blocks = sorted(map_blocks(s) - before)
    s.commit(Change(appends={2: recs([3000])}, log=b"c"), IOClass.UPDATE)
    copy = _crash_image(tmp_path, tmp_path / "s", "copy")
    s.close()
    data = copy / "data"
    if lost == "unsynced":  # commit b's blocks: zeros (never written) and one old block's bytes
        _rewrite_blocks(data, lambda old: [bytes(BLOCK)] * (len(old) - 1) + [bytes(old[-1][::-1])], *b_blocks)
    else:
        _rewrite_blocks(data, lambda old: [bytes(BLOCK)], *a_blocks)
    caplog.set_level("WARNING", logger="vindex.storage.blocks")
    again = open_store(copy, create=False)
    try:
        if lost == "unsynced":
            assert vids_of(again, [0, 1, 2]) == [list(range(300)) + [1000], [7], []]
            assert [r for _, r in again.log_since(0)] == [b"a"]
            assert "2 log records from lsn 2 on, whose data blocks never reached the disk" in caplog.text
            with pytest.raises(CorruptionError, match="state covers log record 2, but the log ends at 1"):
                again.continue_after(2)  # a checkpoint saved after the lost commits
            again.continue_after(1)
            assert again.commit(Change(appends={1: recs([9])}, log=b"d"), IOClass.UPDATE) == 2
        else:
            assert vids_of(again, [1, 2]) == [[7] + list(range(2000, 2400)), [3000]]
            assert [r for _, r in again.log_since(0)] == [b"a", b"b", b"c"]
            with pytest.raises(CorruptionError, match=rf"block {a_blocks[0]} of posting 0 fails its checksum"):
                again.read(np.array([0]), IOClass.INTERACTIVE)
    finally:
        again.close()
    if lost == "unsynced":  # the cut is for good: the reused blocks hold the new commit
        again = open_store(copy, create=False)
        assert vids_of(again, [0, 1, 2]) == [list(range(300)) + [1000], [7, 9], []]
        assert [r for _, r in again.log_since(0)] == [b"a", b"d"]
        again.close()


def test_close_says_the_log_is_synced_and_big_writes_sync_on_their_own(tmp_path, monkeypatch):
    """After a close, opening reads nothing back (the last record claims every commit synced);
    a store that has written ``sync_every_blocks`` unsynced blocks syncs and the next record
    claims it, which bounds what an open after a crash reads back."""
    s = open_store(tmp_path / "s")
    s.commit(Change(appends={0: recs(range(500))}, log=b"a"), IOClass.UPDATE)
    s.close()
    checked = []
    real = DataFile.unwritten
    monkeypatch.setattr(DataFile, "unwritten", lambda self, b, sums: checked.append(b.size) or real(self, b, sums))
    s = open_store(tmp_path / "s", create=False, sync_every_blocks=8)
    assert checked == [0]
    s.commit(Change(appends={1: recs(range(100))}, log=b"b"), IOClass.UPDATE)  # 1 block: no sync
    assert s._log.synced_lsn < s._log.lsn
    s.commit(Change(appends={2: recs(range(2000))}, log=b"c"), IOClass.UPDATE)  # 12 blocks
    assert s._log.synced_lsn == s._log.lsn
    s.commit(Change(appends={3: recs([1])}, log=b"d"), IOClass.UPDATE)  # its record claims c synced
    copy = _crash_image(tmp_path, tmp_path / "s", "copy")
    s.close()
    checked.clear()
    open_store(copy, create=False).close()
    assert checked == [1]  # d's one block, not the 13 of b and c


def test_replay_tracks_blocks_only_unsynced_records_wrote():
    """``blockmap.replay``: a record's kept blocks are not its own; a block it wrote that a later
    record released is not checked; records at or below ``durable`` are not tracked."""
    e = lambda blocks, n: blockmap.Entry(np.array(blocks, np.uint32), n, np.array(blocks, np.uint32) + 100)
    rs = 1024  # four records per block
    snap = {0: e([0, 1], 8)}
    recs_ = [blockmap.LogRecord(1, 1, {0: e([0, 1, 2], 9)}, None),     # durable
             blockmap.LogRecord(2, 2, {0: e([0, 1, 3], 10), 1: e([4], 1)}, None),
             blockmap.LogRecord(3, 3, {1: e([5], 2), 2: e([6, 7], 5)}, None)]
    got = blockmap.replay(snap, recs_, rs, durable=1)
    assert got.blocks.tolist() == [3, 5, 6, 7] and got.lsns.tolist() == [2, 3, 3, 3]
    assert got.sums.tolist() == [103, 105, 106, 107]
    assert got.map.get(1).blocks.tolist() == [5] and got.map.lengths.array()[2] == 5
    assert blockmap.durable_lsn(0, recs_) == 0
    recs_[2].unsynced = 2  # record 3 says record 1 was synced when it was written
    assert blockmap.durable_lsn(0, recs_) == 1


def test_index_after_a_power_loss_that_lost_the_last_upserts_data(tmp_path, caplog):
    """Through the library: upserts acknowledged under durability="process" whose data blocks
    a power loss took (their log records survived) are gone after reopening, the ones before
    the last sync are all there, and the index is consistent (verify, get, search)."""
    import vindex

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2000, 16)).astype(np.float32)
    idx = vindex.Index.build(tmp_path / "idx", x, store="blocks", rebalance=False)
    store = idx._engine.store
    early, late = rng.standard_normal((2, 50, 16)).astype(np.float32)
    idx.upsert(np.arange(5000, 5050), early)
    store.sync()
    before = set(store._map.referenced().tolist())
    idx.upsert(np.arange(6000, 6050), late)
    idx.upsert(np.arange(0, 10), late[:10])  # replaces built vectors
    lost = sorted(set(store._map.referenced().tolist()) - before)
    copy = _crash_image(tmp_path, tmp_path / "idx", "copy")
    idx.close()
    _rewrite_blocks(copy / "store" / "data", lambda old: [bytes(BLOCK)] * len(old), *lost)
    caplog.set_level("WARNING", logger="vindex.storage.blocks")
    again = vindex.Index.open(copy)
    assert "2 log records from lsn" in caplog.text
    try:
        assert again.verify().ok
        vecs, found = again.get(np.arange(5000, 5050))
        assert found.all() and np.array_equal(vecs, early)
        assert not again.get(np.arange(6000, 6050))[1].any()
        vecs, found = again.get(np.arange(0, 10))
        assert found.all() and np.array_equal(vecs, x[:10])
        res = again.search(late[:5], k=10)
        assert not np.isin(res.ids, np.arange(6000, 6050)).any()
    finally:
        again.close()


def test_index_over_a_damaged_block_raises_corruption(tmp_path):
    """Through the library: a search and a get that read the damaged posting raise
    CorruptionError naming the data file; vectors in other postings still come back."""
    import vindex

    x = np.random.default_rng(3).standard_normal((2000, 16)).astype(np.float32)
    idx = vindex.Index.build(tmp_path / "idx", x, store="blocks", rebalance=False)
    eng = idx._engine
    home = eng.state.idmap.home[eng.state.idmap.live_vids(np.arange(2000))]
    pid = int(home[0])
    other = int(np.flatnonzero(home != pid)[0])
    block = int(eng.store._map.get(pid).blocks[0])
    want = idx.search(x[:1], k=5).ids
    idx.close()
    data = tmp_path / "idx" / "store" / "data"
    _rewrite_blocks(data, _flip(100, 3), block)
    idx = vindex.Index.open(tmp_path / "idx", rebalance=False)
    try:
        message = rf"data file {data}: block {block} of posting {pid} fails its checksum"
        with pytest.raises(CorruptionError, match=message):
            idx.search(x[:1], k=5)
        with pytest.raises(CorruptionError, match=message):
            idx.get([0])
        vecs, found = idx.get([other])
        assert found.all() and np.array_equal(vecs[0], x[other])
    finally:
        idx.close()
    _rewrite_blocks(data, _flip(100, 3), block)  # repaired: the same answers as before
    idx = vindex.Index.open(tmp_path / "idx", rebalance=False)
    np.testing.assert_array_equal(idx.search(x[:1], k=5).ids, want)
    idx.close()


def test_checksum_cost_of_a_64_posting_read(tmp_path, engine, monkeypatch, capsys):
    """Measured, not asserted: a read of 64 postings of ~25 KB (7 blocks each, the default
    posting size) with and without the checksum check, and the kernel alone."""
    from vindex.native import checksum

    rs = 520  # a 128-dim float32 vector and its header
    s = open_store(tmp_path / "s", engine=engine, record_size=rs)
    load(s, {p: list(range(p * 100, p * 100 + 48)) for p in range(80)})
    pids = np.arange(64)
    blocks_ = np.concatenate([s._map.get(p).blocks for p in pids.tolist()])
    sums = np.concatenate([s._map.get(p).sums for p in pids.tolist()])
    verify = blocks.verify

    def timed(check: bool) -> float:
        monkeypatch.setattr(blocks, "verify", verify if check else lambda *a: None)
        t = time.perf_counter()
        batch = s.read(pids, IOClass.INTERACTIVE)
        took = time.perf_counter() - t
        assert batch.offsets[-1] == 64 * 48
        return took

    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(60):  # interleaved, so both see the same disk and load
        times[bool(i % 2)].append(timed(bool(i % 2)))
    with open(tmp_path / "s" / "data", "rb") as f:  # the gathered read, before compaction
        buf = np.frombuffer(bytearray(b"".join(os.pread(f.fileno(), BLOCK, b * BLOCK)
                                               for b in blocks_.tolist())), np.uint8)
    assert checksum.first_bad(buf, sums) == -1
    kernel = []
    for _ in range(200):
        t = time.perf_counter()
        checksum.first_bad(buf, sums)
        kernel.append(time.perf_counter() - t)
    s.close()
    with_, without = np.median(times[True]) * 1e6, np.median(times[False]) * 1e6
    k = np.median(kernel) * 1e6
    with capsys.disabled():
        print(f"\n[{engine}] 64-posting read ({blocks_.shape[0]} blocks): {without:.0f} us unchecked, "
              f"{with_:.0f} us checked (median of 30 each); kernel alone {k:.1f} us "
              f"= {k / blocks_.shape[0]:.3f} us per block")


def test_missing_store_locking_and_reopen(tmp_path):
    with pytest.raises(CorruptionError, match="missing"):
        open_store(tmp_path / "nothing", create=False)
    s = open_store(tmp_path / "s")
    with pytest.raises(IndexLockedError):
        open_store(tmp_path / "s", create=False)
    s.close()
    s.close()  # idempotent
    with pytest.raises(StorageError, match="closed"):
        s.read(np.array([0]), IOClass.INTERACTIVE)
    open_store(tmp_path / "s", create=False).close()


# --- failed writes -------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["data", "log"])
def test_failed_write_applies_nothing(tmp_path, monkeypatch, target):
    s = open_store(tmp_path / "s")
    load(s, {0: list(range(200)), 1: [1]})
    assert s.commit(Change(appends={0: recs([500])}, log=b"a"), IOClass.UPDATE) == 1
    before, lengths, used = vids_of(s, [0, 1, 2]), s.lengths().copy(), map_blocks(s)
    real = diskio.pwrite

    def full(fd, data, offset):
        if (fd == s._log.fd) == (target == "log"):
            n = real(fd, bytes(data)[:10], offset) if target == "log" else 0  # a partial record
            raise OSError(errno.ENOSPC, f"No space left on device ({n} bytes written)")
        return real(fd, data, offset)

    monkeypatch.setattr(diskio, "pwrite", full)
    with pytest.raises(StorageError, match=f"{target}") as err:
        s.commit(Change(appends={0: recs([600]), 2: recs([7])}, replaces={1: recs([8])}, log=b"b"), IOClass.UPDATE)
    assert err.value.errno == errno.ENOSPC
    assert vids_of(s, [0, 1, 2]) == before and map_blocks(s) == used
    np.testing.assert_array_equal(s.lengths()[: lengths.shape[0]], lengths)
    monkeypatch.undo()
    assert s.commit(Change(appends={0: recs([700])}, log=b"c"), IOClass.UPDATE) == 2  # seq did not advance
    s.close()
    s = open_store(tmp_path / "s", create=False)
    assert vids_of(s, [0, 1, 2]) == [before[0] + [700], [1], []]
    assert [r for _, r in s.log_since(0)] == [b"a", b"c"]
    s.close()


# --- reclamation ---------------------------------------------------------------------------------
def test_released_blocks_wait_for_fsync_and_for_readers(tmp_path, engine):
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {0: list(range(400)), 1: [1]})  # posting 0: 9600 bytes, 3 blocks
    held = set(s._map.get(0)[0].tolist())
    ticket = s._tickets.begin()  # a read that looked posting 0 up and is still reading it
    s.commit(Change(replaces={0: recs([5])}), IOClass.UPDATE)
    s.sync()
    for i in range(10):  # commits that need blocks; none may be the reader's
        s.commit(Change(replaces={10 + i: recs(range(400))}), IOClass.UPDATE)
        assert not held & map_blocks(s)
    assert held <= set(s._map.held().tolist())
    s._tickets.end(ticket)
    s.commit(Change(replaces={30: recs(range(400))}), IOClass.UPDATE)
    assert set(s._map.get(30)[0].tolist()) == held  # reused once the reader is gone

    # without an fsync the release is not durable: the blocks wait, reader or not
    held = set(s._map.get(30)[0].tolist())
    s.commit(Change(drops=[30]), IOClass.UPDATE)
    s.commit(Change(replaces={31: recs(range(400))}), IOClass.UPDATE)
    assert not held & map_blocks(s) and held <= set(s._map.held().tolist())
    s.sync()
    s.commit(Change(replaces={32: recs(range(400))}), IOClass.UPDATE)
    assert set(s._map.get(32)[0].tolist()) == held
    s.close()


def test_a_paused_read_gets_the_old_posting_intact(tmp_path):
    """A read queued behind busy workers (ticket taken, blocks looked up) while the posting is
    replaced, synced and its blocks wanted by later commits: it still reads the old records."""
    s = open_store(tmp_path / "s", engine="preadv")
    load(s, {0: list(range(400))})
    held = set(s._map.get(0)[0].tolist())
    gate = block_workers(s, IOClass.INTERACTIVE)
    out = {}
    reader = threading.Thread(target=lambda: out.update(v=vids_of(s, [0])))
    reader.start()
    wait_until(lambda: s._sched.queues.depth(IOClass.INTERACTIVE) == 1)
    s.commit(Change(replaces={0: recs([9])}), IOClass.UPDATE)
    s.sync()
    for i in range(5):
        s.commit(Change(replaces={10 + i: recs(range(400))}), IOClass.UPDATE)
    assert not held & map_blocks(s)
    gate.set()
    reader.join()
    assert out["v"] == [list(range(400))]
    s.commit(Change(replaces={20: recs(range(400))}), IOClass.UPDATE)
    assert set(s._map.get(20)[0].tolist()) == held
    s.close()


# --- I/O classes ---------------------------------------------------------------------------------
def test_expired_interactive_read_is_dropped(tmp_path, engine):
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {0: [1, 2]})
    with pytest.raises(DeadlineExpired):
        vids_of(s, [0], deadline=time.monotonic() - 1)
    assert vids_of(s, [0], deadline=time.monotonic() + 60) == [[1, 2]]
    st = s.stats()
    assert st["engine"] == engine and st["io"]["dropped"]["interactive"] == 1
    s.close()


@pytest.mark.skipif(not _uring_works(), reason="no io_uring")
def test_idle_class_reads_on_the_callers_own_ring(tmp_path):
    """With nothing queued, a read runs on the calling thread's own ring, in waves when it
    has more runs than the ring holds; a thread's ring goes when the thread ends, the rest
    when the store closes."""
    s = open_store(tmp_path / "s", engine="io_uring")
    for p in range(100):
        s.commit(Change(appends={p: recs([p, p + 1000])}), IOClass.UPDATE)
    pids = list(range(99, -1, -1))  # descending blocks: one run each, 100 > a ring's 64
    inline = s._sched.inline
    assert vids_of(s, pids) == [[p, p + 1000] for p in pids]
    assert s._sched.inline == inline + 1 and len(s._sched._own_rings) == 1

    got = {}
    t = threading.Thread(target=lambda: got.setdefault("v", vids_of(s, [5, 3])))
    t.start()
    t.join()
    gc.collect()
    assert got["v"] == [[5, 1005], [3, 1003]] and len(s._sched._own_rings) == 1  # the thread's ring went
    own = next(iter(s._sched._own_rings))
    s.close()
    assert own.ring is None and own.closed


@pytest.mark.skipif(not _uring_works(), reason="no io_uring")
def test_a_failed_inline_read_drops_the_thread_ring_and_the_next_read_gets_a_new_one(tmp_path, monkeypatch):
    from vindex.storage import uring

    s = open_store(tmp_path / "s", engine="io_uring")
    load(s, {0: [1, 2]})
    assert vids_of(s, [0]) == [[1, 2]]
    own = next(iter(s._sched._own_rings))
    first = own.ring

    def fail(self, n):
        raise OSError(errno.EIO, "injected")

    with monkeypatch.context() as m:
        m.setattr(uring.Ring, "submit_and_wait", fail)
        with pytest.raises(StorageError, match="injected"):
            vids_of(s, [0])
    assert own.ring is None
    assert vids_of(s, [0]) == [[1, 2]] and own.ring is not None and own.ring is not first
    s.close()


def test_interactive_deadline_while_queued_and_classes_apart(tmp_path):
    """sla: with the interactive workers busy, a background read still runs; an interactive
    read still queued at its deadline is dropped; one without a deadline waits its turn."""
    s = open_store(tmp_path / "s", engine="preadv")
    load(s, {0: [1, 2], 1: [3]})
    gate = block_workers(s, IOClass.INTERACTIVE)
    assert vids_of(s, [1], IOClass.BACKGROUND) == [[3]]
    deadline = time.monotonic() + 0.05
    results: dict = {}

    def read(name, **kw):
        try:
            results[name] = vids_of(s, [0], **kw)
        except DeadlineExpired as exc:
            results[name] = exc

    threads = [threading.Thread(target=read, args=("late",), kwargs={"deadline": deadline}),
               threading.Thread(target=read, args=("patient",))]
    for t in threads:
        t.start()
    wait_until(lambda: s._sched.queues.depth(IOClass.INTERACTIVE) == 2)
    wait_until(lambda: time.monotonic() > deadline)
    gate.set()
    for t in threads:
        t.join()
    assert isinstance(results["late"], DeadlineExpired) and results["patient"] == [[1, 2]]
    s.close()


def test_fifo_shares_one_queue(tmp_path, engine):
    s = open_store(tmp_path / "s", engine=engine, io_scheduler="fifo")
    load(s, {0: [1, 2]})
    assert vids_of(s, [0], IOClass.BACKGROUND) == [[1, 2]]
    assert s.stats()["io"]["mode"] == "fifo"
    s.close()
    if engine == "preadv":  # busy shared workers hold up every class
        s = open_store(tmp_path / "s", engine=engine, io_scheduler="fifo", create=False)
        gate = block_workers(s, None)
        fut = s._sched.submit(IOClass.BACKGROUND, lambda: "ran")
        assert s._sched.queues.depth(IOClass.BACKGROUND) == 1 and not fut.done()
        gate.set()
        assert fut.result(10) == "ran"
        s.close()


def test_engines_and_stats(tmp_path, monkeypatch):
    monkeypatch.setenv("VINDEX_NO_URING", "1")
    s = open_store(tmp_path / "a")
    assert s.stats()["engine"] == "preadv"
    s.close()
    monkeypatch.delenv("VINDEX_NO_URING")
    s = open_store(tmp_path / "b")
    assert s.stats()["engine"] == ("io_uring" if _uring_works() else "preadv")
    load(s, {0: list(range(300)), 3: [1]})
    vids_of(s, [0, 3])
    vids_of(s, [3], IOClass.BACKGROUND)
    st = s.stats()
    assert st["kind"] == "blocks" and st["direct_io"] is True
    assert st["reads_by_class"] == {"interactive": 1, "update": 0, "background": 1}
    assert st["reads"] == 3 and st["read_bytes"] == (300 + 1 + 1) * RS
    assert st["blocks_used"] == 3 and st["file_bytes"] >= 3 * BLOCK
    assert isinstance(st["disk_scheduler"], str) and st["disk_scheduler"]
    np.testing.assert_array_equal(s.fragments(np.array([0, 3, 99])), [1, 1, 0])
    s.close()


def test_buffered_io_when_o_direct_is_refused(tmp_path, monkeypatch, caplog):
    def refuse(path):
        raise OSError(errno.EINVAL, "Invalid argument")

    monkeypatch.setattr(diskio, "open_direct", refuse)
    s = open_store(tmp_path / "s")
    assert s.stats()["direct_io"] is False
    assert "O_DIRECT refused" in caplog.text
    load(s, {0: list(range(300))})
    s.commit(Change(appends={0: recs([9])}), IOClass.UPDATE)
    assert vids_of(s, [0]) == [list(range(300)) + [9]]
    s.close()


def test_disk_scheduler_is_logged(tmp_path, caplog):
    caplog.set_level("INFO", logger="vindex.storage.blocks")
    open_store(tmp_path / "s").close()
    assert "I/O scheduler" in caplog.text
    dev, sched = diskio.disk_scheduler(str(tmp_path))
    assert dev and sched  # "unknown" where /sys does not say


# --- the map, without I/O ------------------------------------------------------------------------
def test_allocation_lays_a_commit_out_in_one_piece():
    m = BlockMap(RS)
    m.free, m.high = np.array([3, 4, 5, 9, 10], dtype=np.int64), 40
    assert [a.tolist() for a in m.allocate([2, 1])] == [[3, 4], [5]]  # one free run holds all
    assert [a.tolist() for a in m.allocate([2, 0, 2, 1])] == [[40, 41], [], [42, 43], [44]]  # none does: grow
    m.high = 11  # now most of the file is free: take pieces, longest runs first
    assert [a.tolist() for a in m.allocate([2, 2])] == [[3, 4], [5, 9]]
    assert m.allocate([]) == [] and [a.tolist() for a in m.allocate([0])] == [[]]
    m.take(np.array([3, 4, 40], dtype=np.uint32))
    assert m.free.tolist() == [5, 9, 10] and m.high == 41


def test_reclaim_needs_durable_release_and_drained_readers():
    m = BlockMap(RS)
    m.release(np.array([1, 2], dtype=np.uint32), lsn=5, boundary=10)
    m.release(np.array([7], dtype=np.uint32), lsn=6, boundary=12)
    assert m.reclaim(synced_lsn=4, drained=lambda b: True) == 0
    assert m.reclaim(synced_lsn=6, drained=lambda b: b <= 10) == 2
    assert m.free.tolist() == [1, 2] and m.held().tolist() == [7]
    assert m.reclaim(synced_lsn=6, drained=lambda b: True) == 1 and m.limbo_blocks == 0



# --- the parts alone ---------------------------------------------------------------------------
def test_tail_cache_keeps_the_newest_within_its_budget_and_only_for_the_same_block():
    def entry(block: int, checksum: int) -> blockmap.Entry:
        return blockmap.Entry(np.array([block], np.uint32), 1, np.array([checksum], np.uint32))

    c = TailCache(3 * 100)
    c.keep([(p, entry(10 + p, 7)) for p in range(4)], [bytes([p]) * 100 for p in range(4)])
    assert list(c.tails) == [1, 2, 3] and c.bytes == 300  # the oldest went
    assert c.get(2, np.array([12]), np.array([7])) == bytes([2]) * 100 and c.hits == 1
    assert c.get(2, np.array([12]), np.array([8])) == b""  # rewritten since: another checksum
    assert c.get(3, np.array([99]), np.array([7])) == b""  # moved to another block
    c.keep([(1, None), (2, entry(12, 7))], [b"", b""])  # dropped; and now a full last block
    assert list(c.tails) == [3] and c.bytes == 100 and c.hits == 1


def test_plan_rereads_the_tail_or_takes_it_from_memory_and_releases_what_moves():
    m = BlockMap(RS)
    tail_bytes = 200 * RS - BLOCK  # posting 0: 200 records, a full block and a partly filled one
    m.install({0: blockmap.Entry(np.array([0, 1], np.uint32), 200, np.array([5, 6], np.uint32)),
               1: blockmap.Entry(np.array([2], np.uint32), 3, np.array([7], np.uint32))})
    tails = TailCache(1 << 20)
    change = Change(appends={0: recs([1, 2])}, replaces={1: recs([3])}, drops=[5])
    work, released = blockplan.plan(change, m, tails, RS)
    assert list(work) == [5, 1, 0] and released.tolist() == [2, 1]  # drops, replaces, appends
    a = work[0]
    assert a.kept.tolist() == [0] and a.records == 202 and a.pieces == [recs([1, 2])]
    assert a.reread.tolist() == [1] and a.reread_bytes == tail_bytes and a.reread_sums.tolist() == [6]
    assert work[1].kept.size == 0 and work[1].records == 1 and work[5].records == 0
    tails.keep([(0, m.get(0))], [b"x" * tail_bytes])  # as the commit that wrote the tail does
    work, released = blockplan.plan(Change(appends={0: recs([1])}), m, tails, RS)
    assert work[0].reread.size == 0 and work[0].pieces == [b"x" * tail_bytes, recs([1])]
    assert released.tolist() == [1]
    with pytest.raises(ValueError, match=f"whole {RS}-byte records"):
        blockplan.plan(Change(appends={0: b"abc"}), m, tails, RS)


def test_data_file_grows_in_steps_writes_in_pieces_and_finds_blocks_that_never_landed(tmp_path):
    d = DataFile(str(tmp_path / "data"), direct=False, write_piece=BLOCK)
    d.grow(12)
    assert d.capacity == datafile.GROW_MIN_BLOCKS  # at least 4 MiB at a time
    pieces = [[recs(range(200))], [recs([1])]]
    chosen = [np.array([4, 5], np.uint32), np.array([9], np.uint32)]
    pauses: list[int] = []
    sums, tails = d.write_postings(pieces, chosen, lambda: pauses.append(1))
    assert len(pauses) == 3 and d.unsynced_blocks == 3  # one pwrite a block, each after a pause
    assert tails == [recs(range(200))[BLOCK:], recs([1])]
    blocks_ = np.array([4, 5, 9, d.capacity], np.uint32)
    wrong = np.concatenate([sums[0], sums[1] ^ 1, [0]]).astype(np.uint32)
    assert d.unwritten(blocks_, wrong).tolist() == [False, False, True, True]  # bad sum; past the end
    d.close()


def test_allocation_syncs_to_reuse_released_blocks_rather_than_grow(tmp_path):
    m = BlockMap(RS)
    d = DataFile(str(tmp_path / "data"), direct=False, write_piece=BLOCK)
    old = allocator.allocate(m, d, [allocator.SYNC_TO_REUSE], sync=lambda: None, reclaim=lambda: 0)[0]
    m.take(old)
    m.release(old, lsn=1, boundary=0)  # all of it waits for the sync of record 1
    synced = []

    def sync() -> None:
        synced.append(1)

    def reclaim() -> int:
        return m.reclaim(len(synced), lambda boundary: True)

    assert allocator.allocate(m, d, [8], sync=sync, reclaim=reclaim)[0].tolist() == list(range(8))
    assert synced == [1] and d.capacity == datafile.GROW_MIN_BLOCKS
    d.close()

def _entry(blocks, records):
    return blockmap.Entry(np.array(blocks, np.uint32), records, np.arange(len(blocks), dtype=np.uint32) + 7)


def test_log_parser_torn_tail_versus_damage_inside():
    recs_ = [blockmap.encode_record(i + 1, i + 1, {i: _entry([i], 1)}, b"x") for i in range(3)]
    data = b"".join(recs_)
    got, end = blockmap.read_log(io.BytesIO(data[:-3]), 0, 1, RS)
    assert [r.lsn for r in got] == [1, 2] and end == len(recs_[0]) + len(recs_[1])
    bad = bytearray(data)
    bad[len(recs_[0]) + 12] ^= 1
    with pytest.raises(FormatError, match="intact records follow"):
        blockmap.read_log(io.BytesIO(bytes(bad)), 0, 1, RS)
    snap = blockmap.encode_snapshot(3, 9, 4, RS, {5: _entry([2, 3], 200)})
    back = blockmap.decode_snapshot(snap, RS)
    assert (back.gen, back.lsn, back.seq) == (3, 9, 4) and back.entries[5].blocks.tolist() == [2, 3]
    assert back.entries[5].sums.tolist() == [7, 8] and back.entries[5].records == 200
    rec = blockmap.decode_payload(recs_[1][8:], RS)
    assert rec.entries[1].blocks.tolist() == [1] and rec.entries[1].sums.tolist() == [7]
    with pytest.raises(FormatError, match="block count"):
        blockmap.decode_snapshot(blockmap.encode_snapshot(3, 9, 4, RS, {5: _entry([2], 200)}), RS)


def test_appends_keep_each_posting_in_few_runs(tmp_path, engine):
    """Postings appended to in turn would each end up in one run per append; an append that
    would leave one in more than MAX_RUNS runs rewrites it whole, contents unchanged."""
    s = open_store(tmp_path / "s", engine=engine)
    load(s, {p: list(range(100 * p, 100 * p + 5)) for p in range(4)})
    want = {p: list(range(100 * p, 100 * p + 5)) for p in range(4)}
    folds = 0
    for step in range(40):
        new = {p: [10_000 + 4 * step + p] * (60 + 40 * (step % 3)) for p in range(4)}  # ~1/2 block
        before = s.fragments(np.arange(4))
        s.commit(Change(appends={p: recs(v) for p, v in new.items()}), IOClass.UPDATE)
        for p, v in new.items():
            want[p] += v
        runs = s.fragments(np.arange(4))
        assert runs.max() <= blockplan.MAX_RUNS, runs
        folds += int(((runs == 1) & (before > 1)).sum())
        assert vids_of(s, list(range(4))) == [want[p] for p in range(4)]
    assert folds > 0  # the interleaved appends did scatter them, and folding gathered them
    s.close()
    s = open_store(tmp_path / "s", create=False, engine=engine)
    assert vids_of(s, list(range(4))) == [want[p] for p in range(4)]
    s.close()


def _count_read_backs(store, monkeypatch) -> list[int]:
    """Old blocks the store reads back for appends, one entry per commit that reads any."""
    got: list[int] = []
    read_back = store._read_back

    def counting(work, io):
        got.append(sum(w.reread.shape[0] for w in work.values()))
        read_back(work, io)

    monkeypatch.setattr(store, "_read_back", counting)
    return got


def test_appends_take_the_tail_block_from_memory(tmp_path, engine, monkeypatch):
    """An append rewrites its posting's partly filled tail block. The load or commit that
    wrote that block left its bytes in memory, so the append reads nothing back; after a
    reopen (nothing kept) the first append reads it from the disk, the next does not."""
    s = open_store(tmp_path / "s", engine=engine)
    want = {p: list(range(100 * p, 100 * p + 5)) for p in range(3)}
    load(s, want)
    reads = _count_read_backs(s, monkeypatch)
    for step in range(6):  # 3 records an append: all stay in the first block
        new = {p: [1000 + 10 * step + p] * 3 for p in range(3)}
        s.commit(Change(appends={p: recs(v) for p, v in new.items()}), IOClass.UPDATE)
        for p, v in new.items():
            want[p] += v
    assert reads == [] and s.stats()["tail_hits"] == 18
    assert vids_of(s, [0, 1, 2]) == [want[p] for p in range(3)]
    s.close()
    s = open_store(tmp_path / "s", create=False, engine=engine)
    reads = _count_read_backs(s, monkeypatch)
    for v in (7, 8):
        s.commit(Change(appends={0: recs([v] * 3)}), IOClass.UPDATE)
        want[0] += [v] * 3
    assert reads == [1] and s.stats()["tail_hits"] == 1
    assert vids_of(s, [0, 1, 2]) == [want[p] for p in range(3)]
    s.close()


def test_kept_tails_stay_within_budget_and_never_serve_stale_bytes(tmp_path, monkeypatch):
    """Random appends, replaces, drops and reloads of the same postings, with room for only a
    few kept tails: every read matches a model of the postings, the tails kept stay within
    the budget, and appends both found their tail in memory and read it back."""
    rng = np.random.default_rng(7)
    s = open_store(tmp_path / "s", tail_cache_bytes=4 * 1024)
    want = {p: [p] * int(rng.integers(1, 300)) for p in range(12)}
    load(s, want)
    reads = _count_read_backs(s, monkeypatch)
    vid = 10_000
    for step in range(150):
        op = rng.random()
        pids = rng.choice(12, size=int(rng.integers(1, 5)), replace=False).tolist()
        if op < 0.7:
            new = {p: list(range(vid, vid + int(rng.integers(1, 200)))) for p in pids}
            s.commit(Change(appends={p: recs(v) for p, v in new.items()}), IOClass.UPDATE)
            for p, v in new.items():
                want[p] += v
        elif op < 0.85:
            new = {p: list(range(vid, vid + int(rng.integers(1, 300)))) for p in pids}
            s.commit(Change(replaces={p: recs(v) for p, v in new.items()}), IOClass.UPDATE)
            want.update(new)
        elif op < 0.93:
            s.commit(Change(drops=pids), IOClass.UPDATE)
            want.update({p: [] for p in pids})
        else:
            new = {p: list(range(vid, vid + int(rng.integers(1, 300)))) for p in pids}
            load(s, new)
            want.update(new)
        vid += 1000
        assert s._tails.bytes == sum(len(t.data) for t in s._tails.tails.values()) <= 4 * 1024
        assert vids_of(s, list(range(12))) == [want[p] for p in range(12)], step
    assert s.stats()["tail_hits"] > 20 and len(reads) > 20
    s.close()


def test_commits_write_in_pieces_issued_after_the_searches_reads(tmp_path, engine, monkeypatch):
    """A commit's data goes to the disk in pieces of at most ``write_piece`` bytes, and none is issued
    while an interactive read is running (IOScheduler.yield_to_interactive)."""
    from vindex import iosched

    s = open_store(tmp_path / "s", engine=engine, targets=iosched.IOTargets(yield_max_s=30.0), write_piece=2 * BLOCK)
    load(s, {0: [1]})
    sizes: list[int] = []
    real = diskio.pwrite

    def counting(fd, data, offset):
        if fd == s._data.fd:
            sizes.append(len(data))
        return real(fd, data, offset)

    monkeypatch.setattr(diskio, "pwrite", counting)
    release, started = threading.Event(), threading.Event()
    # an interactive request that holds its slot until released (the parent's run: io_uring's
    # would take it for a read job)
    reader = threading.Thread(target=iosched.IOScheduler.run,
                              args=(s.scheduler, IOClass.INTERACTIVE, lambda: (started.set(), release.wait(30))))
    reader.start()
    try:
        assert started.wait(30)
        n = 5 * BLOCK // RS
        committer = threading.Thread(target=s.commit, args=(Change(replaces={0: recs(range(n))}), IOClass.UPDATE))
        committer.start()
        wait_until(lambda: s.scheduler.stats()["yields"], "the commit to yield", timeout=30)
        assert sizes == [] and committer.is_alive()  # nothing written while the read runs
    finally:
        release.set()
        reader.join(30)
    committer.join(30)
    assert not committer.is_alive()
    assert sum(sizes) >= 5 * BLOCK and max(sizes) <= 2 * BLOCK
    assert vids_of(s, [0]) == [list(range(n))]
    s.close()
