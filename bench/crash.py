"""Crash harness: kill -9 a writing process at random moments and check what survives.

A child process opens the index (small postings, so splits, merges, reassignments and
checkpoints run all the time) and applies a deterministic stream of upserts and deletes,
printing ``B i`` before operation ``i`` and ``A i`` once it returned (acknowledged). The
parent SIGKILLs it at a random moment, reopens the index and checks:

* every acknowledged upsert is present with identical vector bytes;
* every acknowledged delete is absent, from ``get`` and from exhaustive searches;
* the one operation in flight is either wholly applied or not at all;
* ``verify()`` reports no violation, and the live count matches.

    python -m bench.crash --cycles 300                   # writes bench/results/crash.json
    python -m bench.crash --cycles 100 --store blocks    # the block store: crash-blocks.json

WAL-corruption mode (``--wal``, in ``bench.crashwal``): a child upserts batches of new ids,
printing after each acknowledged batch where the store's write-ahead log then ended (the newest
``store/*.log`` of RocksDB, ``store/log.<gen>`` of the block store); it checkpoints once after
``--checkpoint-at`` rows and is SIGKILLed mid-upsert once ``--rows`` rows were acknowledged.
Each cycle then damages a copy of the index three ways and reopens it:

* a byte flipped at each ``--fractions`` of the log: ``Index.open`` must raise
  ``CorruptionError`` naming the log file, leave the file as it was and fail again when
  retried (nothing was checkpointed over the damage);
* the log truncated at a random offset after the checkpoint (a torn tail): it must open, with
  exactly the batches acknowledged before the cut (RocksDB; the block store may end its log a
  few commits earlier, as after a power loss, or, when the cut took synced records away, fail
  reads of blocks a cut commit reused with ``CorruptionError``) with their vectors, and
  ``verify()`` clean;
* (RocksDB) the log truncated before the checkpoint's records: ``CorruptionError``, since the
  checkpoint covers records the store no longer has.

    python -m bench.crash --wal --rows 20000 --cycles 3 --fractions 0.1 0.5   # crash-wal.json

The child is a fresh interpreter (``subprocess``), never a fork of a process holding RocksDB.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from . import measure

DIM = 16
ID_SPACE = 3000
CONFIG = dict(posting_limit_bytes=1024, build_fill=0.5, checkpoint_every=400, rebalance_batch=32)
#: A quarter of the kills land at a random moment after the child starts (open, log replay,
#: warm-up); the rest at a random moment within this many seconds of its first operation.
EARLY_KILLS = 0.25
KILL_AFTER = (0.0, 1.5)


def make_op(seed: int, i: int) -> tuple[str, np.ndarray, np.ndarray | None]:
    """Operation ``i`` of stream ``seed``: ("upsert", ids, vectors) or ("delete", ids, None).

    Vectors come from clusters that drift with ``i``, so postings keep splitting and merging."""
    rng = np.random.default_rng([seed, i])
    if rng.random() < 0.3:
        ids = np.unique(rng.integers(0, ID_SPACE, int(rng.integers(1, 25))))
        return "delete", ids, None
    ids = np.unique(rng.integers(0, ID_SPACE, int(rng.integers(1, 60))))
    center = np.random.default_rng([seed, (i // 50) % 7]).standard_normal(DIM) * 3
    x = (center + rng.standard_normal((ids.size, DIM))).astype(np.float32)
    return "upsert", ids, x


def child(path: str, seed: int, first: int) -> None:
    import vindex

    index = vindex.Index.open(path)
    # large commits write their new chunks ahead in pieces; tiny pieces make every commit of
    # a few postings do that, so kills land between the pieces and the commit too
    if hasattr(index._engine.store, "early_write_keys"):  # the RocksDB store's
        index._engine.store.early_write_keys = 4
    vindex.warmup()
    out = sys.stdout
    out.write("R\n")
    out.flush()
    i = first
    while True:
        kind, ids, x = make_op(seed, i)
        out.write(f"B {i}\n")
        out.flush()
        if kind == "upsert":
            index.upsert(ids, x)
        else:
            index.delete(ids)
        out.write(f"A {i}\n")
        out.flush()
        i += 1


@dataclass
class Model:
    """What must be in the index: id -> vector for live ids."""

    live: dict[int, np.ndarray] = field(default_factory=dict)

    def apply(self, op: tuple[str, np.ndarray, np.ndarray | None]) -> "Model":
        kind, ids, x = op
        live = dict(self.live)
        for j, i in enumerate(ids.tolist()):
            if kind == "upsert":
                live[i] = x[j]
            else:
                live.pop(i, None)
        return Model(live)


@dataclass
class Totals:
    cycles: int = 0
    acknowledged_ops: int = 0
    acknowledged_writes: int = 0  # ids upserted or deleted by acknowledged operations
    in_flight_applied: int = 0
    in_flight_absent: int = 0
    killed_before_ready: int = 0
    lost: int = 0                 # acknowledged upserts missing or with other bytes
    resurrected: int = 0          # acknowledged deletes that came back
    torn: int = 0                 # in-flight operations half applied
    verify_failures: int = 0
    recovery_s: list = field(default_factory=list)
    problems: list = field(default_factory=list)


def _observe(index, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return index.get(ids)


def _matches(model: Model, ids: np.ndarray, got: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Per id: does the index agree with ``model``?"""
    ok = np.empty(ids.size, dtype=np.bool_)
    for j, i in enumerate(ids.tolist()):
        want = model.live.get(i)
        ok[j] = (not found[j]) if want is None else (found[j] and np.array_equal(got[j], want))
    return ok


def check(path: str, model: Model, pending: tuple | None, totals: Totals, rng) -> Model:
    """Reopen after a kill; returns the model the index turned out to hold."""
    import vindex

    t0 = time.perf_counter()
    index = vindex.Index.open(path, rebalance=False)
    totals.recovery_s.append(time.perf_counter() - t0)
    try:
        if pending is not None:  # the operation in flight: all or nothing
            after = model.apply(pending)
            ids = pending[1]
            got, found = _observe(index, ids)
            if _matches(after, ids, got, found).all():
                model = after
                totals.in_flight_applied += 1
            elif _matches(model, ids, got, found).all():
                totals.in_flight_absent += 1
            else:
                totals.torn += 1
                totals.problems.append(f"cycle {totals.cycles}: operation in flight half applied")
        ids = np.arange(ID_SPACE)
        got, found = _observe(index, ids)
        ok = _matches(model, ids, got, found)
        for i in ids[~ok].tolist():
            if i in model.live:
                totals.lost += 1
            else:
                totals.resurrected += 1
        if (~ok).any():
            totals.problems.append(f"cycle {totals.cycles}: ids {ids[~ok][:10].tolist()} disagree")
        if len(index) != len(model.live):
            totals.problems.append(f"cycle {totals.cycles}: {len(index)} live, model has {len(model.live)}")
        report = index.verify()
        if not report.ok:
            totals.verify_failures += 1
            totals.problems.append(f"cycle {totals.cycles}: {report.violations}")
        if model.live:  # deleted ids never come back in results either
            keys = np.array(sorted(model.live))
            q = np.stack([model.live[k] for k in rng.choice(keys, min(20, keys.size), replace=False)])
            res = index.search(q, 10, max_postings=4096, eps=np.inf)
            seen = res.ids[res.ids >= 0]
            dead = [i for i in np.unique(seen).tolist() if i not in model.live]
            if dead:
                totals.resurrected += len(dead)
                totals.problems.append(f"cycle {totals.cycles}: search returned deleted ids {dead[:10]}")
    finally:
        index.close()
    return model


def kill_child(proc: subprocess.Popen, reader: threading.Thread, what: str) -> None:
    """SIGKILL ``proc``, which must still be running, and wait for ``reader`` to take the
    rest of its output."""
    if proc.poll() is not None:
        raise RuntimeError(f"{what} exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader.join()
    proc.stderr.close()


def run(path: str, cycles: int, seed: int = 0, log=print, store: str = "rocksdb") -> Totals:
    """``cycles`` kill-and-check rounds on a new index at ``path`` on ``store``."""
    import vindex

    vindex.Index.create(path, dim=DIM, store=store, **CONFIG).close()
    rng = np.random.default_rng(seed)
    model, totals, next_op = Model(), Totals(), 0
    for cycle in range(cycles):
        totals.cycles = cycle + 1
        proc = subprocess.Popen([sys.executable, "-m", "bench.crash", "--child", path, str(seed), str(next_op)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=measure.REPO_ROOT)
        lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            for line in proc.stdout:
                lines.append(line)
                ready.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if rng.random() >= EARLY_KILLS:
            ready.wait(60)
        time.sleep(rng.uniform(*KILL_AFTER))
        kill_child(proc, reader, "crash child")
        begun = [int(ln.split()[1]) for ln in lines if ln.startswith("B ")]
        acked = {int(ln.split()[1]) for ln in lines if ln.startswith("A ")}
        if "R\n" not in lines:
            totals.killed_before_ready += 1
        pending = None
        for i in begun:
            op = make_op(seed, i)
            if i in acked:
                model = model.apply(op)
                totals.acknowledged_ops += 1
                totals.acknowledged_writes += op[1].size
            else:
                pending = op
        next_op = (max(begun) + 1) if begun else next_op
        model = check(path, model, pending, totals, rng)
        if log and (cycle + 1) % 10 == 0:
            log(f"cycle {cycle + 1}/{cycles}: {totals.acknowledged_ops} ops acknowledged, "
                f"{len(model.live)} live, lost {totals.lost}, resurrected {totals.resurrected}, "
                f"torn {totals.torn}, verify failures {totals.verify_failures}")
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("PATH", "SEED", "FIRST"), help=argparse.SUPPRESS)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", choices=["rocksdb", "blocks"], default="rocksdb")
    ap.add_argument("--out", default=None, help="default bench/results/crash.json (crash-blocks.json for blocks)")
    ap.add_argument("--wal", action="store_true", help="WAL-corruption mode (see above)")
    ap.add_argument("--rows", type=int, default=20_000, help="--wal: rows acknowledged before the kill")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.5],
                    help="--wal: where in the log to flip a byte")
    ap.add_argument("--wal-child", nargs=3, metavar=("PATH", "SEED", "CHECKPOINT_AT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    kind = "-wal" if args.wal else ""
    out = args.out or f"bench/results/crash{kind}{'' if args.store == 'rocksdb' else '-' + args.store}.json"
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    from . import crashwal  # which imports this module

    if args.wal_child:
        crashwal.child(args.wal_child[0], int(args.wal_child[1]), int(args.wal_child[2]))
        return
    from .report import write_json

    if args.wal:
        with tempfile.TemporaryDirectory() as tmp:
            result = crashwal.cycles(tmp, args.cycles, args.rows, args.fractions, store=args.store, seed=args.seed)
        write_json(out, result)
        print({k: v for k, v in result.items() if k != "problems"})
        for p in result["problems"][:20]:
            print("PROBLEM", p)
        sys.exit(1 if result["problems"] else 0)

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        totals = run(os.path.join(tmp, "idx"), args.cycles, args.seed, store=args.store)
        elapsed = time.time() - t0
    rec = np.array(totals.recovery_s)
    result = {k: v for k, v in totals.__dict__.items() if k != "recovery_s"}
    result.update(seconds=round(elapsed, 1), recovery_s_median=float(np.median(rec)),
                  recovery_s_max=float(rec.max()), config=CONFIG, dim=DIM, id_space=ID_SPACE, store=args.store)
    write_json(out, result)
    print({k: v for k, v in result.items() if k != "problems"})
    for p in totals.problems[:20]:
        print("PROBLEM", p)
    sys.exit(1 if totals.problems else 0)


if __name__ == "__main__":
    main()
