"""Another process's disk traffic: O_DIRECT writes and reads at given rates, until killed.

    python -m bench.diskload --file /tmp/x --write-mb-s 80 --write-kib 64 --reads-s 7000 --read-kib 16

``bench.sla --disk-load`` runs it beside tenant A alone, replaying tenant B's disk traffic
as measured in the same run: the slowdown the disk alone causes, with no GIL or store shared
(as ``--burner`` measures the cores alone). It fills ``--size-mib`` of ``--file`` first (reads
of never-written blocks cost the disk nothing), prints ``ready``, then writes through the file
in order (at most 4 MiB a write) and reads at random on ``--readers`` threads, at B's CPU and
I/O priorities (nice 10, best effort 4).
"""
from __future__ import annotations

import argparse
import mmap
import os
import random
import sys
import threading
import time
from typing import Callable

from vindex.iosched import lower_thread_priority
from vindex.storage import IOClass
from vindex.storage.uring import CLASS_IOPRIO, thread_ioprio

ALIGN = 4096
#: Longest sleep between ops when none is due: small next to a search's read.
IDLE_SLEEP_S = 0.0005


def _size(kib: float) -> int:
    """Bytes in whole aligned blocks, at least one."""
    return max(ALIGN, int(kib * 1024) // ALIGN * ALIGN)


def run(path: str, size: int, write_bps: float, write_size: int, reads_per_s: float, read_size: int,
        readers: int) -> None:
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0)
    fd = os.open(path, flags, 0o600)
    fill = mmap.mmap(-1, 4 << 20)  # page-aligned, as O_DIRECT needs
    fill.write(os.urandom(len(fill)))
    for off in range(0, size, len(fill)):
        os.pwrite(fd, memoryview(fill)[:min(len(fill), size - off)], off)
    os.fsync(fd)
    print("ready", flush=True)
    t0 = time.perf_counter()
    # reads on several threads, as a store issues them many at a time (preadv releases the GIL)
    for _ in range(readers if reads_per_s > 0 else 0):
        threading.Thread(target=_read_loop, args=(fd, size, read_size, reads_per_s / readers, t0),
                         daemon=True).start()
    wview = memoryview(fill)[:min(write_size, len(fill))]
    woff = 0

    def write() -> None:
        nonlocal woff
        if woff + len(wview) > size:
            woff = 0
        os.pwrite(fd, wview, woff)
        woff += len(wview)

    _paced(write_bps / len(wview), t0, write)


def _read_loop(fd: int, size: int, read_size: int, rate: float, t0: float) -> None:
    lower_thread_priority()
    buf = mmap.mmap(-1, read_size)
    rng = random.Random()
    with thread_ioprio(CLASS_IOPRIO[IOClass.UPDATE]):
        _paced(rate, t0, lambda: os.preadv(fd, [buf], rng.randrange(size // read_size) * read_size))


def _paced(per_s: float, t0: float, op: Callable[[], object]) -> None:
    """Call ``op`` ``per_s`` times a second from ``t0`` on, forever, sleeping while none is due."""
    done = 0
    while True:
        if done < per_s * (time.perf_counter() - t0):
            op()
            done += 1
        else:
            time.sleep(IDLE_SLEEP_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", required=True)
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--write-mb-s", type=float, default=0.0, help="MiB written a second")
    ap.add_argument("--write-kib", type=float, default=64.0, help="size of one write")
    ap.add_argument("--reads-s", type=float, default=0.0, help="reads a second")
    ap.add_argument("--read-kib", type=float, default=4.0, help="size of one read")
    ap.add_argument("--readers", type=int, default=4, help="threads reading")
    args = ap.parse_args(argv)
    lower_thread_priority()
    with thread_ioprio(CLASS_IOPRIO[IOClass.UPDATE]):
        run(args.file, args.size_mib << 20, args.write_mb_s * (1 << 20), _size(args.write_kib),
            args.reads_s, _size(args.read_kib), max(1, args.readers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
