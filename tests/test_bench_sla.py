"""bench.sla's disk accounting and bench.diskload, the process that replays B's disk traffic."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import wait_until

from bench import sla

REPO = Path(__file__).resolve().parent.parent
linux_only = pytest.mark.skipif(not os.path.exists("/proc/diskstats"), reason="reads /proc/diskstats")


def test_disk_rates_are_per_second_and_sized():
    before = np.array([100.0, 800.0, 10.0, 2048.0])
    after = np.array([300.0, 1600.0, 30.0, 10240.0])  # +200 reads (800 sectors), +20 writes (8192)
    r = sla.disk_rates(before, after, 2.0)
    assert r["reads_per_s"] == 100 and r["writes_per_s"] == 10
    assert r["read_kib"] == pytest.approx(2.0) and r["write_kib"] == pytest.approx(204.8)
    assert r["write_mib_per_s"] == pytest.approx(8192 * 512 / 2**20 / 2)
    assert sla.disk_rates(None, after, 2.0) is None


def test_b_traffic_is_the_sla_run_less_a_alone_reads():
    disk = {"reads_per_s": 900.0, "read_kib": 16.0, "write_mib_per_s": 50.0, "write_kib": 64.0}
    alone = {"disk": {"reads_per_s": 300.0}}
    b = sla.b_traffic({"disk": disk}, alone)
    assert b == {"reads_per_s": 600.0, "read_kib": 16.0, "write_mib_per_s": 50.0, "write_kib": 64.0}
    assert sla.b_traffic({"disk": disk}, {"disk": {"reads_per_s": 2000.0}})["reads_per_s"] == 0
    assert sla.b_traffic({"disk": None}, alone) is None


@pytest.fixture
def on_disk(tmp_path):
    """``tmp_path``, on a block device (tmpfs has none, and no O_DIRECT)."""
    if sla.disk_counters(str(tmp_path)) is None:
        pytest.skip(f"{tmp_path} is on no block device")
    return tmp_path


@linux_only
def test_disk_counters_find_the_device_of_a_path(on_disk):
    c = sla.disk_counters(str(on_disk))
    assert c.shape == (4,) and (c >= 0).all()


@linux_only
def test_diskload_reads_and_writes_its_file_at_the_rates_asked(on_disk):
    path = on_disk / "load.bin"
    proc = subprocess.Popen([sys.executable, "-m", "bench.diskload", "--file", str(path), "--size-mib", "8",
                             "--write-mb-s", "8", "--write-kib", "64", "--reads-s", "400", "--read-kib", "4"],
                            stdout=subprocess.PIPE, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        assert path.stat().st_size == 8 << 20
        io0, t0 = _proc_io(proc.pid), time.perf_counter()
        time.sleep(1.5)
        io1, took = _proc_io(proc.pid), time.perf_counter() - t0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    reads = (io1["syscr"] - io0["syscr"]) / took
    written = (io1["write_bytes"] - io0["write_bytes"]) / took / 2**20
    assert 200 < reads < 800, reads  # 400 a second asked
    assert 4 < written < 16, written  # 8 MiB a second asked


def _proc_io(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def test_pooled_latencies_are_sorted_for_the_cdf():
    def run(lat):  # as one_run returns it: each run's latencies sorted on their own
        return {"a": {"p50": 1.0, "p99": 2.0, "p999": 3.0}, "a_latencies_ms": sorted(lat), "b_rows_per_s": 0.0,
                "splits": 0, "reassigns": 0, "store_io": None, "disk": None, "replayed": None}

    pooled = sla.median_run([run([3.0, 1.0]), run([2.0, 0.5])])["a_latencies_ms"]
    assert pooled == [0.5, 1.0, 2.0, 3.0]  # one run after another would draw a staircase


def test_apart_ingests_its_own_copy_at_idle_priority_on_cue(tmp_path):
    """bench.apart, tenant B in a process of its own: nothing before ``go``, rows counted
    after it, every thread under SCHED_IDLE with ``--idle``, and what it upserted is in its
    copy once it exits at end of input."""
    import vindex
    from bench import synthetic
    from vindex.storage import uring

    path = tmp_path / "b"
    vindex.Index.build(path, synthetic.make_rows(0, 2_000, 128, 0), progress=False).close()
    proc = subprocess.Popen([sys.executable, "-m", "bench.apart", "--index", str(path), "--first-id", "2000",
                             "--rows", "3000", "--batch", "500", "--idle", "--io-idle"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == "ready"
        assert os.sched_getscheduler(proc.pid) == os.SCHED_IDLE
        if uring._SYS_IOPRIO_GET is not None:  # the idle I/O class (3), which its threads inherit
            assert uring._syscall(uring._SYS_IOPRIO_GET, uring._IOPRIO_WHO_PROCESS, proc.pid) >> 13 == 3
        proc.stdin.write("rows\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "0"  # no upserts before go
        proc.stdin.write("go\n")
        deadline, rows = time.monotonic() + 60, 0
        while rows < 3000 and time.monotonic() < deadline:
            proc.stdin.write("rows\n")
            proc.stdin.flush()
            rows = int(proc.stdout.readline())
            time.sleep(0.05)
        assert rows == 3000
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    with vindex.Index.open(path) as index:
        assert len(index) == 5000
        _, found = index.get(np.arange(2000, 5000))
        assert found.all()


def test_paced_ingest_waits_for_each_batch_s_turn():
    """bench.sla.Ingest with ``rows_per_s`` (bench.apart --rows-per-s): each batch waits for
    its turn, so 5 batches of 10 at 200 rows/s span at least 4 turns of 0.05 s."""
    from bench.sla import Ingest

    calls: list[float] = []

    class Instant:
        def upsert(self, ids, x):
            calls.append(time.perf_counter())

    ingest = Ingest(Instant(), np.zeros((50, 4), np.float32), 0, 10, low_priority=False, rows_per_s=200.0)
    ingest.start()
    ingest.join(10)
    assert ingest.rows == 50 and len(calls) == 5
    assert calls[-1] - calls[0] >= 0.9 * 4 * 10 / 200


def test_the_burner_ends_with_the_process_that_started_it():
    """bench.sla's burner outlived a bench.sla killed mid-run and kept both cores busy; it now
    ends once its parent is gone."""
    starter = subprocess.Popen(
        [sys.executable, "-c", "import os, subprocess, sys\n"
         "p = subprocess.Popen([sys.executable, '-c', sys.argv[1], str(os.getpid())])\nprint(p.pid, flush=True)",
         sla.BURNER],
        stdout=subprocess.PIPE, text=True)
    pid = int(starter.stdout.readline())
    starter.stdout.close()
    assert starter.wait(timeout=30) == 0

    def running() -> bool:  # a zombie waiting for its new parent to reap it has ended
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    wait_until(lambda: not running(), "the burner to end", timeout=30)
