"""Tenant B in a process of its own: ``bench.sla``'s ingest, on its own copy of the index.

    python -m bench.apart --index DIR --first-id N [--idle] [--io-idle] [--rows-per-s R]

``bench.sla --apart`` runs it beside tenant A alone: B's whole workload (upserts flat out,
the splits, reassignments and merges they cause, the store's writes) with nothing shared with
A's process but the cores and the disk. That is the best a design with the writer out of the
search process could do on this machine: A's index does not grow and no state is shared, so
the figure is a floor for such a design, not a measure of one.

Every thread runs at B's CPU priority under ``sla`` (nice 10), or with ``--idle`` under
``SCHED_IDLE`` (it runs only when nothing else wants the core); with ``--io-idle`` every
read and write is in the kernel's idle I/O class; ``--rows-per-s`` paces the upserts.
Protocol on stdin/stdout: prints ``ready`` once the index is open and warm, starts ingesting
at ``go``, answers each ``rows`` with the rows upserted so far, and exits at end of input.
"""
from __future__ import annotations

import argparse
import os
import sys

import vindex
from vindex.iosched import LOW_PRIORITY_NICE

from . import synthetic
from .sla import Ingest


def lower_process_priority(idle: bool) -> None:
    """Before any thread starts: threads inherit the policy and nice value of their creator."""
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    else:
        os.setpriority(os.PRIO_PROCESS, 0, LOW_PRIORITY_NICE)


def idle_io() -> None:
    """Every read and write of this process in the kernel's idle I/O class: the process's
    own priority (threads inherit it) and the one the stores tag each class's requests with."""
    from vindex.storage import uring
    if uring._SYS_IOPRIO_SET is None:
        raise SystemExit(f"--io-idle: no ioprio_set system call known on {os.uname().machine}")
    idle = uring.ioprio(3, 7)  # IOPRIO_CLASS_IDLE
    uring._syscall(uring._SYS_IOPRIO_SET, uring._IOPRIO_WHO_PROCESS, 0, idle)
    for cls in list(uring.CLASS_IOPRIO):
        uring.CLASS_IOPRIO[cls] = idle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True, help="B's own copy of the index")
    ap.add_argument("--first-id", type=int, required=True, help="the first new id (and synthetic row)")
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--idle", action="store_true", help="SCHED_IDLE instead of nice 10")
    ap.add_argument("--rows-per-s", type=float, default=0.0, help="pace the upserts (0: flat out)")
    ap.add_argument("--io-idle", action="store_true", help="every read and write in the idle I/O class")
    ap.add_argument("--switch-interval-ms", type=float, default=0.25)
    args = ap.parse_args(argv)
    lower_process_priority(args.idle)
    if args.io_idle:
        idle_io()
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    x = synthetic.make_rows(args.first_id, args.first_id + args.rows, 128, 0)
    vindex.warmup()
    index = vindex.Index.open(args.index)
    # the same ingest as bench.sla's thread; the process's priority is already B's
    ingest = Ingest(index, x, args.first_id, args.batch, low_priority=False,
                    rows_per_s=args.rows_per_s or None)
    print("ready", flush=True)
    try:
        for line in sys.stdin:
            if line.strip() == "go" and ingest.ident is None:  # started once
                ingest.start()
            elif line.strip() == "rows":
                print(ingest.rows, flush=True)
    finally:
        ingest.stop_flag.set()
        if ingest.is_alive():
            ingest.join()
        index.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
