"""Durability contract: group commit, fault injection, corruption detection and verify()."""
from __future__ import annotations

import contextlib
import errno
import glob
import json
import logging
import os
import subprocess
import threading

import numpy as np
import pytest

import vindex
from conftest import wait_until
from vindex.errors import CorruptionError, StorageError
from vindex.failures import RateLimitedLog
from vindex.groupsync import GroupSync
from vindex.storage import IOClass
from vindex.storage.faults import FaultyStore

DIM = 16
SMALL = dict(posting_limit_bytes=1024, build_fill=0.5)  # 14 vectors a posting: splits happen


def _vectors(rng, n, shift=0.0):
    return (rng.standard_normal((n, DIM)) + shift).astype(np.float32)


@pytest.fixture
def index(tmp_path):
    rng = np.random.default_rng(0)
    idx = vindex.Index.build(tmp_path / "idx", _vectors(rng, 2000), **SMALL)
    yield idx
    idx.close()


# --- group commit ---------------------------------------------------------------------------------
def test_group_sync_one_fsync_covers_writers_that_committed_before_it():
    committed = [0]
    started, release = threading.Event(), threading.Event()
    calls = []

    def sync():
        calls.append(committed[0])
        started.set()
        release.wait(5)

    gs = GroupSync(sync, lambda: committed[0])
    committed[0] = 1
    first = threading.Thread(target=gs.wait, args=(1,))
    first.start()
    assert started.wait(5)  # the first writer's fsync is running
    committed[0] = 3        # two more writers commit meanwhile and wait
    later = [threading.Thread(target=gs.wait, args=(s,)) for s in (2, 3)]
    for t in later:
        t.start()
    release.set()
    for t in [first, *later]:
        t.join(5)
        assert not t.is_alive()
    assert calls == [1, 3]  # one fsync for the first writer, one shared by the next two
    assert gs.durable == 3 and gs.syncs == 2


def test_group_sync_failure_reaches_every_waiter_and_clears():
    fail = [True]

    def sync():
        if fail[0]:
            raise StorageError(28, "disk full")

    gs = GroupSync(sync, lambda: 5)
    with pytest.raises(StorageError):
        gs.wait(5)
    assert gs.durable == 0
    fail[0] = False
    gs.wait(5)
    assert gs.durable == 5


def test_fsync_durability_syncs_before_acknowledging(tmp_path):
    rng = np.random.default_rng(1)
    idx = vindex.Index.build(tmp_path / "idx", _vectors(rng, 500), durability="fsync")
    try:
        for i in range(5):
            idx.upsert([1000 + i], _vectors(rng, 1))
        idx.delete([0, 1])
        s = idx.stats()
        assert s["durability"] == "fsync" and s["fsyncs"] == 6
        # concurrent writers share fsyncs: never more than one per write

        def writer(t):
            for i in range(30):
                idx.upsert([2000 + 100 * t + i], _vectors(np.random.default_rng(t * 100 + i), 1))
        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 0 < idx.stats()["fsyncs"] - 6 <= 120
        assert len(idx) == 500 + 5 - 2 + 120
    finally:
        idx.close()


def test_durability_is_a_runtime_setting(tmp_path):
    rng = np.random.default_rng(2)
    vindex.Index.build(tmp_path / "idx", _vectors(rng, 100)).close()
    with vindex.Index.open(tmp_path / "idx", durability="fsync") as idx:
        idx.upsert([500], _vectors(rng, 1))
        assert idx.stats()["fsyncs"] == 1
    with pytest.raises(vindex.InvalidConfigError, match="durability"):
        vindex.Index.open(tmp_path / "idx", durability="sometimes")


# --- fault injection ------------------------------------------------------------------------------
def test_failed_commit_is_not_acknowledged_and_the_index_recovers(tmp_path, index):
    rng = np.random.default_rng(3)
    faults = FaultyStore.install(index)
    acked = {}
    faults.arm(commit_after=2, classes=(IOClass.UPDATE,))
    failed = []
    for i in range(6):
        ids = np.arange(5000 + 10 * i, 5010 + 10 * i)
        x = _vectors(rng, 10)
        try:
            index.upsert(ids, x)
            acked.update(zip(ids.tolist(), x))
        except StorageError as exc:
            assert exc.errno == 28 and "ENOSPC" in str(exc)
            failed.extend(ids.tolist())
    assert len(acked) == 20 and len(failed) == 40  # two writes went through, then the disk was full
    with pytest.raises(StorageError):
        index.delete([5000])
    assert index.get([5000])[1][0]  # the failed delete changed nothing
    assert not index.get(failed)[1].any()
    faults.clear()
    x = _vectors(rng, 10)
    index.upsert(np.arange(9000, 9010), x)
    acked.update(zip(range(9000, 9010), x))
    assert index.wait_idle(60)
    assert index.verify().ok
    path = index.path
    index.close()
    with vindex.Index.open(path) as again:
        ids = np.array(sorted(acked))
        got, found = again.get(ids)
        assert found.all()
        np.testing.assert_array_equal(got, np.stack([acked[i] for i in ids]))
        assert not again.get(failed)[1].any()
        assert again.verify().ok


def test_background_failures_surface_and_clear(index):
    rng = np.random.default_rng(4)
    faults = FaultyStore.install(index)
    faults.arm(commit_after=0, classes=(IOClass.BACKGROUND,))
    x = _vectors(rng, 600, shift=2.0)
    index.upsert(np.arange(10_000, 10_600), x)  # splits are due, and fail
    with pytest.raises(StorageError):
        index.wait_idle(60)
    assert index.stats()["background_errors"] >= 1
    np.testing.assert_array_equal(index.get(np.arange(10_000, 10_600))[0], x)  # nothing lost
    faults.clear()
    assert index.wait_idle(120)
    s = index.stats()
    assert s["postings_over_limit"] == 0 and s["splits"] > 0
    report = index.verify()
    assert report.ok, str(report)
    np.testing.assert_array_equal(index.get(np.arange(10_000, 10_600))[0], x)


def test_wait_idle_ignores_a_failure_from_a_round_running_before_the_call(index):
    faults, hold = FaultyStore.install(index), threading.Event()
    faults.arm(commit_after=0, classes=(IOClass.BACKGROUND,), hold=hold)
    index.upsert(np.arange(10_000, 10_600), _vectors(np.random.default_rng(5), 600, shift=2.0))
    assert faults.holding.wait(30)  # a round is inside its (doomed) commit
    faults.clear()  # the cause is gone
    threading.Timer(0.2, hold.set).start()  # the round fails while the call below waits
    assert index.wait_idle(120)  # its retry succeeds: that is what the caller asked about
    assert index.stats()["background_errors"] == 1
    assert index.stats()["postings_over_limit"] == 0
    assert index.verify().ok


def test_failed_fsync_is_not_acknowledged(tmp_path):
    rng = np.random.default_rng(5)
    idx = vindex.Index.build(tmp_path / "idx", _vectors(rng, 300), durability="fsync")
    try:
        faults = FaultyStore.install(idx)
        faults.arm(sync=True, err=5)
        with pytest.raises(StorageError, match="fsync"):
            idx.upsert([700], _vectors(rng, 1))
        faults.clear()
        idx.upsert([701], _vectors(rng, 1))  # the next fsync covers both
        assert idx.get([700, 701])[1].all()
    finally:
        idx.close()


def test_repeated_background_failures_log_one_line_and_back_off(index, caplog):
    """A round failing on a full disk again and again: one line (no traceback) per kind of
    failure per minute, and the pause before each retry doubles."""
    faults = FaultyStore.install(index)
    faults.arm(commit_after=0, classes=(IOClass.BACKGROUND,))
    with caplog.at_level(logging.INFO, logger="vindex.rebalance"):
        index.upsert(np.arange(10_000, 10_600), _vectors(np.random.default_rng(6), 600, shift=2.0))
        wait_until(lambda: faults.failures >= 4, "four failed rounds", timeout=60)
        faults.clear()
        assert index.wait_idle(120)
    lines = [r for r in caplog.records if "background round failed" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].exc_info is None and "StorageError" in lines[0].getMessage()
    assert "ENOSPC" in lines[0].getMessage()
    gaps = np.diff(faults.failed_at[:4])
    assert (gaps[1:] > 1.5 * gaps[:-1]).all(), gaps  # 0.5 s, 1 s, 2 s plus the rounds themselves
    assert index.verify().ok


def test_a_checkpoint_failing_on_a_full_disk_backs_off_and_logs_once(tmp_path, caplog):
    """A due checkpoint whose store sync fails (as on a full disk) is retried after a pause
    that doubles, not at once in a loop; one log line, no traceback."""
    rng = np.random.default_rng(9)
    idx = vindex.Index.build(tmp_path / "idx", _vectors(rng, 300), checkpoint_every=10, rebalance=False)
    try:
        faults = FaultyStore.install(idx)
        faults.arm(sync=True)
        with caplog.at_level(logging.INFO, logger="vindex.checkpoint"):
            idx.upsert(np.arange(1000, 1020), _vectors(rng, 20))  # a checkpoint is due
            wait_until(lambda: faults.failures >= 3, "three failed checkpoints", timeout=60)
            faults.clear()
            assert idx.wait_idle(60)
        gaps = np.diff(faults.failed_at[:3])
        assert (gaps >= 0.4).all() and gaps[1] > 1.5 * gaps[0], gaps  # 0.5 s, then 1 s
        lines = [r for r in caplog.records if "background checkpoint failed" in r.getMessage()]
        assert len(lines) == 1 and lines[0].exc_info is None, [r.getMessage() for r in lines]
    finally:
        idx.close()


def test_rate_limited_log_says_how_many_repeats_it_held_back(caplog):
    now = [0.0]
    failures = RateLimitedLog(logging.getLogger("vindex.test"), interval_s=60, clock=lambda: now[0])
    full, broken = StorageError(errno.ENOSPC, "disk full"), StorageError(errno.EIO, "bad sector")
    with caplog.at_level(logging.ERROR, logger="vindex.test"):
        assert failures.failure("round failed", full)
        for t in (1, 2, 30):
            now[0] = t
            assert not failures.failure("round failed", full)
        assert failures.failure("round failed", broken)  # another kind has its own minute
        now[0] = 61
        assert failures.failure("round failed", full)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and all(r.exc_info is None for r in caplog.records)
    assert "disk full" in messages[0] and "bad sector" in messages[1]
    assert "(3 more like it in the last 61 s not logged)" in messages[2]


# --- a full disk (a real one: a small tmpfs) ------------------------------------------------------
SMALL_DISK_BYTES = 64 << 20


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MiB tmpfs mounted for the test (root only: skipped where mounting is refused)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_DISK_BYTES}", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


def _fill(disk, leave: int) -> str:
    """A file taking all but ``leave`` bytes of ``disk``; remove it to free the space."""
    path = os.path.join(disk, "filler")
    st = os.statvfs(disk)
    with open(path, "wb") as f:
        f.write(bytes(max(0, st.f_bavail * st.f_frsize - leave)))
    return path


def _write_until_full(idx, rng, acked: dict) -> None:
    """Upsert batches until one fails with ENOSPC; ``acked`` gains every acknowledged row."""
    for _ in range(1000):
        ids = np.arange(len(acked), len(acked) + 200) + 100_000 * (1 + len(acked) // 100_000)
        x = _vectors(rng, 200)
        try:
            idx.upsert(ids, x)
        except StorageError as exc:
            assert exc.errno == errno.ENOSPC and "disk is full" in str(exc), exc
            return
        acked.update(zip(ids.tolist(), x))
    raise AssertionError("the disk never filled")


def _assert_kept(idx, acked: dict) -> None:
    ids = np.array(sorted(acked))
    got, found = idx.get(ids)
    assert found.all(), f"{int((~found).sum())} acknowledged rows lost"
    np.testing.assert_array_equal(got, np.stack([acked[i] for i in ids]))


def test_a_full_disk_stops_writes_until_space_is_freed_even_across_a_restart(small_disk):
    rng = np.random.default_rng(7)
    path = small_disk / "idx"
    acked: dict = {}
    idx = vindex.Index.create(path, dim=DIM)
    stop, searched, failures = threading.Event(), [0], []

    def search() -> None:  # throughout, and across the store's reopening in place
        queries = _vectors(np.random.default_rng(8), 4)
        while not stop.is_set():
            try:
                idx.search(queries, 5)
                searched[0] += 1
            except Exception as exc:
                failures.append(exc)
                return
    searcher = threading.Thread(target=search)
    try:
        filler = _fill(small_disk, leave=3 << 20)
        _write_until_full(idx, rng, acked)
        _assert_kept(idx, acked)  # searches and gets go on
        searcher.start()
        os.remove(filler)
        x = _vectors(rng, 10)
        idx.upsert(np.arange(10), x)  # space is back: writes resume, no restart
        acked.update(zip(range(10), x))
        stop.set()
        searcher.join()
        assert not failures and searched[0] > 0, failures
        assert idx.wait_idle(120)
        filler = _fill(small_disk, leave=3 << 20)
        _write_until_full(idx, rng, acked)
    finally:
        stop.set()
        if searcher.is_alive():
            searcher.join()
        with contextlib.suppress(StorageError):  # its checkpoint cannot be written: the log keeps all
            idx.close()
    with vindex.Index.open(path) as idx:  # on the full disk: opens (read-only), not damaged
        assert idx.stats()["store"]["writes_stopped"]
        _assert_kept(idx, acked)
        assert idx.search(_vectors(rng, 3), 5).ids.shape == (3, 5)
        with pytest.raises(StorageError, match="disk is full") as refused:
            idx.upsert([1], _vectors(rng, 1))
        assert refused.value.errno == errno.ENOSPC
        with pytest.raises(StorageError) as created:
            vindex.Index.create(small_disk / "new", dim=DIM)
        assert created.value.errno == errno.ENOSPC and not os.path.exists(small_disk / "new")
        os.remove(filler)
        x = _vectors(rng, 1)
        idx.upsert([1], x)  # writable again, in place
        acked[1] = x[0]
        assert not idx.stats()["store"]["writes_stopped"]
        assert idx.wait_idle(120)
        assert idx.verify().ok
    with vindex.Index.open(path) as idx:
        _assert_kept(idx, acked)
        assert idx.verify().ok


# --- corruption -----------------------------------------------------------------------------------
def _flip(path: str, offsets) -> None:
    data = bytearray(open(path, "rb").read())
    for off in offsets:
        data[off % len(data)] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)


def test_flipped_bytes_in_the_posting_store_raise_corruption(tmp_path):
    rng = np.random.default_rng(6)
    x = _vectors(rng, 20_000)
    vindex.Index.build(tmp_path / "idx", x).close()
    sst = max(glob.glob(str(tmp_path / "idx" / "store" / "*.sst")), key=os.path.getsize)
    _flip(sst, range(4096, os.path.getsize(sst) // 2, 20_000))
    with pytest.raises(CorruptionError, match="checksum"):
        with vindex.Index.open(tmp_path / "idx") as idx:
            idx.search(x[:50], 10, max_postings=4096)
            idx.verify()


def test_a_checkpoint_cut_short_by_a_full_disk_is_a_storage_error(tmp_path, monkeypatch):
    """numpy reports a short write as an OSError without errno: the save answers ENOSPC,
    removes its partial files and leaves the checkpoint before it in place."""
    from vindex import checkpoint
    checkpoint.save(str(tmp_path), 1, {"a": np.arange(10)}, {})
    real_save = np.save

    def short_write(f, arr, **kwargs):
        real_save(f, arr[:1], **kwargs)
        raise OSError("80 requested and 8 written")

    monkeypatch.setattr(np, "save", short_write)
    with pytest.raises(StorageError) as ei:
        checkpoint.save(str(tmp_path), 2, {"a": np.arange(10)}, {})
    assert ei.value.errno == errno.ENOSPC and "80 requested and 8 written" in str(ei.value)
    monkeypatch.setattr(np, "save", real_save)
    assert os.listdir(tmp_path / "checkpoint") == [f"{1:020d}"]
    assert checkpoint.load(str(tmp_path), 1)[0]["a"].tolist() == list(range(10))


def test_truncated_checkpoint_raises_corruption(tmp_path):
    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(7), 500)).close()
    victim = glob.glob(str(tmp_path / "idx" / "checkpoint" / "*" / "versions.npy"))[0]
    with open(victim, "r+b") as f:
        f.truncate(os.path.getsize(victim) - 7)
    with pytest.raises(CorruptionError, match="versions.npy"):
        vindex.Index.open(tmp_path / "idx")


def test_flipped_checkpoint_bytes_raise_corruption(tmp_path):
    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(8), 500)).close()
    victim = glob.glob(str(tmp_path / "idx" / "checkpoint" / "*" / "head_vectors.npy"))[0]
    _flip(victim, [os.path.getsize(victim) - 3])
    with pytest.raises(CorruptionError, match="checksum"):
        vindex.Index.open(tmp_path / "idx")


def test_corrupt_manifest_raises_corruption(tmp_path):
    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(9), 100)).close()
    with open(tmp_path / "idx" / "vindex.json", "w") as f:
        f.write('{"dim": 16, "metric": "l2", "conf')
    with pytest.raises(CorruptionError):
        vindex.Index.open(tmp_path / "idx")


def _edit_manifest(path, edit, *, keep_checksum: bool = True) -> None:
    file = os.path.join(path, "vindex.json")
    with open(file) as f:
        data = json.load(f)
    edit(data)
    if not keep_checksum:
        del data["checksum"]
    with open(file, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("field, value", [("dim", 32), ("metric", "ip")])
def test_an_edited_manifest_fails_its_checksum(tmp_path, capsys, field, value):
    """Another dim or metric in vindex.json would give wrong answers: the checksum of its
    other fields refuses the file, and ``vindex verify`` says so (exit 2)."""
    from vindex.service.cli import main

    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(9), 100)).close()
    _edit_manifest(tmp_path / "idx", lambda d: d.__setitem__(field, value))
    with pytest.raises(CorruptionError, match=r"vindex.json: checksum mismatch \(edited by hand\?\)"):
        vindex.Index.open(tmp_path / "idx")
    assert main(["verify", str(tmp_path / "idx")]) == 2
    assert "vindex.json: checksum mismatch" in capsys.readouterr().err


def test_a_manifest_written_before_checksums_opens_and_verify_says_so(tmp_path, capsys):
    from vindex.service.cli import main

    x = _vectors(np.random.default_rng(9), 100)
    vindex.Index.build(tmp_path / "idx", x).close()
    _edit_manifest(tmp_path / "idx", lambda d: None, keep_checksum=False)
    with vindex.Index.open(tmp_path / "idx") as idx:
        assert idx.search(x[:2], 1).ids[:, 0].tolist() == [0, 1]
        assert idx.verify().checked["manifest_checksum"] == "none (written before checksums)"
    assert main(["verify", str(tmp_path / "idx")]) == 0
    assert "manifest_checksum: none (written before checksums)" in capsys.readouterr().out


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["config"].__setitem__("posting_limit_bytes", -1), "posting_limit_bytes"),
    (lambda d: d.__setitem__("metric", "hamming"), "metric"),
    (lambda d: d.__setitem__("dim", 0), "dim"),
    (lambda d: d.__setitem__("config", [1]), "config"),
])
def test_an_invalid_stored_manifest_is_corruption_not_bad_input(tmp_path, edit, match):
    """What vindex.json holds is not the caller's input: an invalid value there is a damaged
    file (DATA_LOSS over gRPC), while a bad runtime setting stays the caller's error."""
    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(9), 100)).close()
    with pytest.raises(vindex.InvalidConfigError, match="cache_bytes"):
        vindex.Index.open(tmp_path / "idx", cache_bytes=-5)
    _edit_manifest(tmp_path / "idx", edit, keep_checksum=False)
    with pytest.raises(CorruptionError, match=f"vindex.json: invalid manifest .*{match}"):
        vindex.Index.open(tmp_path / "idx")


def _log_cf(path):
    from rocksdict import Options, Rdict

    db = Rdict(str(path / "store"), Options(raw_mode=True),
               column_families={n: Options(raw_mode=True) for n in ("postings", "pdir", "log", "payload")})
    return db, db.get_column_family("log")


def _killed_with_three_log_records(path, seed: int) -> None:
    """An index at ``path`` whose process stopped as a killed one would after three upserts
    of ids 1000..1002: no checkpoint at close, so they are in the log only."""
    rng = np.random.default_rng(seed)
    idx = vindex.Index.build(path, _vectors(rng, 300), rebalance=False)
    for i in range(3):
        idx.upsert([1000 + i], _vectors(rng, 1))
    idx._closed = True
    idx._finalizer()


def test_corrupt_or_missing_log_records_raise_corruption(tmp_path):
    _killed_with_three_log_records(tmp_path / "idx", 10)
    db, log = _log_cf(tmp_path / "idx")
    keys = list(log.keys())
    assert len(keys) == 3
    record = bytearray(log[keys[1]])
    record[-1] ^= 0xFF
    log[keys[1]] = bytes(record)
    log.close()
    db.close()
    with pytest.raises(CorruptionError, match="checksum"):
        vindex.Index.open(tmp_path / "idx")
    db, log = _log_cf(tmp_path / "idx")
    del log[keys[1]]  # a gap: record 2 is gone, 3 would replay on the wrong state
    log.close()
    db.close()
    with pytest.raises(CorruptionError, match="gap"):
        vindex.Index.open(tmp_path / "idx")


def test_an_open_that_fails_after_the_replay_has_started_no_checkpoint_thread(tmp_path, monkeypatch):
    """After the log replay, opening drops postings a crash left orphaned; if that fails, no
    background thread may be running yet (the checkpoint one would save, and truncate the log
    of, an index that failed to open), and the store is released."""
    from vindex import checkpoint
    from vindex import index as index_module

    _killed_with_three_log_records(tmp_path / "idx", 15)
    threads = {}

    def failing_drop_orphans(engine):
        threads["checkpoint"] = engine.checkpoints._thread
        raise StorageError(5, "injected: dropping orphaned postings failed")

    monkeypatch.setattr(index_module, "drop_orphans", failing_drop_orphans)
    with pytest.raises(StorageError, match="injected"):
        vindex.Index.open(tmp_path / "idx", checkpoint_every=1)  # a checkpoint is due at once
    assert threads == {"checkpoint": None}
    assert checkpoint.latest(str(tmp_path / "idx")) == 0
    monkeypatch.undo()
    with vindex.Index.open(tmp_path / "idx") as again:
        assert again.get([1000, 1001, 1002])[1].all()


def test_a_block_store_log_that_ends_before_the_checkpoint_is_corruption(tmp_path):
    """A checkpoint saved, then a crash before the log's rotation, then the log cut by hand
    before the checkpoint's records: the store cannot replay what the checkpoint names."""
    from vindex.storage import Change, open_store

    def store(create):
        return open_store("blocks", str(tmp_path / "s"), record_size=72, cache_bytes=0, create=create)

    s = store(True)
    s.commit(Change(log=b"first"), IOClass.UPDATE)
    first_end = s._log.end
    for rec in (b"second", b"third"):
        s.commit(Change(log=rec), IOClass.UPDATE)
    s.close()
    os.truncate(glob.glob(str(tmp_path / "s" / "log.*"))[0], first_end)
    again = store(False)
    try:
        with pytest.raises(CorruptionError, match=r"covers log record 3, but the log ends at 1 \(a truncated log file"):
            again.continue_after(3)
        again.continue_after(1)
    finally:
        again.close()


# --- verify ---------------------------------------------------------------------------------------
def test_verify_passes_on_a_churned_index_and_names_each_broken_invariant(index):
    rng = np.random.default_rng(11)
    for i in range(5):
        index.upsert(np.arange(300 * i, 300 * i + 400), _vectors(rng, 400, shift=1.5))
        index.delete(np.arange(1500 + 50 * i, 1530 + 50 * i))
        report = index.verify()
        assert report.ok, str(report)
    assert index.wait_idle(120)
    report = index.verify()
    assert report.ok, str(report)
    assert report.checked["live"] == len(index)

    st = index._engine.state
    with index._engine.lock:
        vid = int(st.idmap.lookup(np.array([10]))[0])
        home = int(st.idmap.home[vid])
        other = int(np.flatnonzero(st.graph.alive[: st.graph.n] & (np.arange(st.graph.n) != home))[0])
        st.idmap.home[vid] = other
        st.idmap.n_live += 1
        victim = int(st.graph.nbrs[other, 0])
        st.graph.nbrs[other, 0] = other
    text = str(index.verify())
    assert "live ids missing from their home posting: 1 ([10])" in text
    assert "live count" in text
    assert "self-loops" in text
    assert "VIOLATION" in text and victim >= 0


def test_verify_cli(tmp_path, capsys):
    from vindex.service.cli import main

    vindex.Index.build(tmp_path / "idx", _vectors(np.random.default_rng(12), 400)).close()
    assert main(["verify", str(tmp_path / "idx")]) == 0
    assert "OK" in capsys.readouterr().out
    with open(glob.glob(str(tmp_path / "idx" / "checkpoint" / "*" / "manifest.json"))[0], "r+") as f:
        meta = json.load(f)
        meta["arrays"]["home"]["crc32"] ^= 1
        f.seek(0)
        f.truncate()
        json.dump(meta, f)
    assert main(["verify", str(tmp_path / "idx")]) == 2
    assert "CorruptionError" in capsys.readouterr().err


# --- the service ----------------------------------------------------------------------------------
def test_a_damaged_collection_answers_data_loss_while_the_others_serve(tmp_path):
    import grpc

    from test_service import ServerProcess

    root = tmp_path / "data" / "collections"
    rng = np.random.default_rng(13)
    x = _vectors(rng, 300)
    for name in ("good", "bad"):
        vindex.Index.build(root / name, x).close()
    victim = glob.glob(str(root / "bad" / "checkpoint" / "*" / "versions.npy"))[0]
    _flip(victim, [os.path.getsize(victim) - 1])
    srv = ServerProcess(tmp_path / "data")
    try:
        assert "bad is damaged" in srv.log()
        with vindex.Client(srv.target, timeout=60) as client:
            assert client.list_collections() == ["good"]
            ids, _ = client.collection("good").search(x[:3], 1)
            assert ids[:, 0].tolist() == [0, 1, 2]
            with pytest.raises(CorruptionError, match="damaged"):
                client.collection("bad").search(x[:3], 1)
            try:
                client.collection("bad").search(x[:3], 1)
            except CorruptionError as exc:
                assert isinstance(exc.__cause__ or exc.__context__, grpc.RpcError)
                assert (exc.__cause__ or exc.__context__).code() == grpc.StatusCode.DATA_LOSS
            assert client.drop_collection("bad")
            assert not os.path.exists(root / "bad")
    finally:
        assert srv.stop() == 0


def test_collections_with_a_bad_manifest_or_write_ahead_log_answer_data_loss_the_others_serve(tmp_path):
    """One collection's damaged files (an unsupported format version, an invalid stored config,
    a hand-edited dim or metric, a byte flipped in the write-ahead log of a killed writer) keep
    that collection closed, answering DATA_LOSS with the file and the reason, and an ERROR log
    line naming it; the server starts and serves the rest."""
    import grpc

    from bench import crashwal
    from test_service import ServerProcess

    root = tmp_path / "data" / "collections"
    x = _vectors(np.random.default_rng(14), 300)
    edits = {
        "v2": (lambda d: d.__setitem__("format_version", 2), True, "vindex.json: format version 2 is not supported"),
        "config": (lambda d: d["config"].__setitem__("graph_degree", 0), False, "vindex.json: invalid manifest"),
        "dim": (lambda d: d.__setitem__("dim", 8), True, "vindex.json: checksum mismatch"),
        "metric": (lambda d: d.__setitem__("metric", "ip"), True, "vindex.json: checksum mismatch"),
    }
    for name in ("good", *edits):
        vindex.Index.build(root / name, x).close()
    for name, (edit, keep, _) in edits.items():
        _edit_manifest(root / name, edit, keep_checksum=keep)
    run = crashwal.write_and_kill(str(root / "wal"), 500)
    log = crashwal.newest_log(run.path)
    crashwal.flip(log, os.path.getsize(log) // 2)
    with open(log, "rb") as f:
        damaged = f.read()
    reasons = {**{name: why for name, (_, _, why) in edits.items()},
               "wal": f"write-ahead log {log} is damaged"}
    srv = ServerProcess(tmp_path / "data")
    try:
        for name in reasons:
            assert f"collection {name} is damaged and stays closed" in srv.log()
        with vindex.Client(srv.target, timeout=60) as client:
            assert client.list_collections() == ["good"]
            assert client.collection("good").search(x[:3], 1).ids[:, 0].tolist() == [0, 1, 2]
            for name, why in reasons.items():
                with pytest.raises(CorruptionError) as caught:
                    client.collection(name).search(x[:1], 1)
                assert why in str(caught.value)
                assert (caught.value.__cause__ or caught.value.__context__).code() == grpc.StatusCode.DATA_LOSS
    finally:
        assert srv.stop() == 0
    with open(log, "rb") as f:  # the server closed without writing over the damaged log
        assert f.read() == damaged
    with pytest.raises(CorruptionError, match="write-ahead log"):
        vindex.Index.open(run.path)


@pytest.mark.parametrize("store", ["rocksdb", "blocks"])
def test_writers_go_on_while_a_background_checkpoint_is_written(tmp_path, monkeypatch, store):
    """The background copies the state for a checkpoint under the writers' lock and writes
    it without: an upsert finishes while the checkpoint's files are stuck, and after a crash
    the checkpoint and the log after it hold every acknowledged vector."""
    from vindex import checkpoint
    rng = np.random.default_rng(11)
    entered, release = threading.Event(), threading.Event()
    save = checkpoint.save

    def stuck_save(*args, **kwargs):
        entered.set()
        release.wait(30)
        save(*args, **kwargs)

    idx = vindex.Index.build(tmp_path / "idx", _vectors(rng, 300), store=store, checkpoint_every=200)
    monkeypatch.setattr(checkpoint, "save", stuck_save)
    x = _vectors(rng, 400)
    try:
        idx.upsert(np.arange(1000, 1250), x[:250])  # 250 vectors written: a checkpoint is due
        assert entered.wait(30)
        later = threading.Thread(target=idx.upsert, args=(np.arange(1250, 1400), x[250:]))
        later.start()
        later.join(10)
        assert not later.is_alive()  # it did not wait for the checkpoint's files
    finally:
        release.set()
    assert idx.wait_idle(60)
    monkeypatch.setattr(checkpoint, "save", save)
    assert 0 < idx.stats()["checkpoint_seq"] < idx.stats()["log_seq"]  # the later upsert is in the log only
    idx._closed = True  # stop as a killed process would: no checkpoint at close
    idx._finalizer()
    with vindex.Index.open(tmp_path / "idx") as again:
        got, found = again.get(np.arange(1000, 1400))
        assert found.all() and np.array_equal(got, x)
        assert again.verify().ok


def test_a_memory_index_past_its_checkpoint_interval_leaves_the_background_idle(tmp_path):
    # a memory index writes no checkpoint, but one is still due every ``checkpoint_every``
    # writes; the background thread once found it due forever and spun (300k a second)
    import time
    rng = np.random.default_rng(12)
    with vindex.Index.build(tmp_path / "m", _vectors(rng, 300), store="memory", checkpoint_every=100) as idx:
        idx.upsert(np.arange(1000, 1300), _vectors(rng, 300))
        deadline = time.monotonic() + 30  # wait_idle does not wait for a due checkpoint
        while idx.stats()["checkpoints"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert idx.wait_idle(30)
        before = idx.stats()["checkpoints"]
        time.sleep(0.3)
        assert before >= 1 and idx.stats()["checkpoints"] == before


@pytest.mark.parametrize("mode, lowered", [("sla", True), ("fifo", False)])
def test_the_checkpoint_thread_gives_the_cores_to_searches_under_sla(tmp_path, mode, lowered):
    """Copying and writing a checkpoint is background work: under ``sla`` its thread runs at
    the rebalancer's lowered CPU priority, as when checkpoints ran on the rebalancer's thread."""
    from conftest import wait_until
    from vindex.iosched import LOW_PRIORITY_NICE

    rng = np.random.default_rng(0)
    with vindex.Index.build(tmp_path / "idx", _vectors(rng, 500), io_scheduler=mode, **SMALL) as idx:
        thread = idx._engine.checkpoints._thread
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        wait_until(lambda: thread.native_id is not None, "the checkpoint thread to start")
        if lowered:
            wait_until(lambda: os.getpriority(os.PRIO_PROCESS, thread.native_id) >= LOW_PRIORITY_NICE,
                       "the checkpoint thread's nice value to reach LOW_PRIORITY_NICE")
        else:
            assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == base
