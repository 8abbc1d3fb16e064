"""WAL-corruption mode of the crash harness (``python -m bench.crash --wal``; see ``bench.crash``).

A killed writer's write-ahead log is damaged on a copy of the index, which is then reopened:
a flipped byte before the log's tail must fail the open with ``CorruptionError`` and leave
the files as they were; a truncated log (what a torn write leaves) must open with every batch
acknowledged before the cut.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from . import measure
from .crash import kill_child

DIM = 16
BATCH = 100
#: Seconds the parent waits for the child's next acknowledged batch before giving up.
CHILD_TIMEOUT_S = 120


def batch_vectors(seed: int, i: int) -> tuple[np.ndarray, np.ndarray]:
    """Batch ``i`` of stream ``seed``: new ids ``i * BATCH ..`` and their vectors."""
    x = np.random.default_rng([seed, i]).standard_normal((BATCH, DIM)).astype(np.float32)
    return np.arange(i * BATCH, (i + 1) * BATCH), x


def newest_log(path: str) -> str:
    """The write-ahead log a store in index directory ``path`` appends to now."""
    store = os.path.join(path, "store")
    names = os.listdir(store)
    rocks = [n for n in names if n.endswith(".log") and n[:-4].isdigit()]
    if rocks:
        return os.path.join(store, max(rocks, key=lambda n: int(n[:-4])))
    blocks = [n for n in names if n.startswith("log.") and n[4:].isdigit()]
    return os.path.join(store, max(blocks, key=lambda n: int(n[4:])))


def child(path: str, seed: int, checkpoint_at: int) -> None:
    """Upsert batches until killed; after each acknowledged batch print ``A i <log> <end>``,
    and ``C <log> <end>`` where the log ended when the checkpoint after ``checkpoint_at``
    rows was taken."""
    import vindex

    index = vindex.Index.open(path)
    out = sys.stdout
    i = 0
    while True:
        ids, x = batch_vectors(seed, i)
        index.upsert(ids, x)
        if checkpoint_at and (i + 1) * BATCH == checkpoint_at:
            log = newest_log(path)
            out.write(f"C {log} {os.path.getsize(log)}\n")
            index.checkpoint()
        log = newest_log(path)
        out.write(f"A {i} {log} {os.path.getsize(log)}\n")
        out.flush()
        i += 1


@dataclass
class Run:
    """What a killed child left: its index, and per acknowledged batch where the log ended."""

    path: str
    store: str
    seed: int
    acked: list[tuple[str, int]] = field(default_factory=list)  # per batch: (log file, end offset)
    checkpoint: tuple[str, int] | None = None  # where the log ended when the checkpoint was taken


def write_and_kill(path: str, rows: int, *, store: str = "rocksdb", seed: int = 0, checkpoint_at: int = 0) -> Run:
    """Create an index at ``path`` and SIGKILL a child upserting into it once ``rows`` rows
    were acknowledged (mid-upsert: it never stops writing)."""
    import vindex

    vindex.Index.create(path, dim=DIM, store=store).close()
    proc = subprocess.Popen([sys.executable, "-m", "bench.crash", "--wal-child", path, str(seed), str(checkpoint_at)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=measure.REPO_ROOT)
    run, enough = Run(path, store, seed), threading.Event()

    def read() -> None:
        for line in proc.stdout:
            word, *rest = line.split()
            if word == "C":
                run.checkpoint = (rest[0], int(rest[1]))
            elif word == "A":
                run.acked.append((rest[1], int(rest[2])))
                if len(run.acked) * BATCH >= rows:
                    enough.set()
        enough.set()  # the child exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    enough.wait(CHILD_TIMEOUT_S)
    kill_child(proc, reader, "WAL child")
    if len(run.acked) * BATCH < rows:
        raise RuntimeError(f"WAL child acknowledged {len(run.acked) * BATCH} rows in {CHILD_TIMEOUT_S} s, not {rows}")
    return run


def copy_of(run: Run, path: str) -> Run:
    """The same run on a copy of its index at ``path`` (log names moved along)."""
    shutil.copytree(run.path, path)
    move = lambda log: os.path.join(path, os.path.relpath(log, run.path))  # noqa: E731
    return Run(path, run.store, run.seed, [(move(f), end) for f, end in run.acked],
               None if run.checkpoint is None else (move(run.checkpoint[0]), run.checkpoint[1]))


def flip(file: str, offset: int) -> None:
    with open(file, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def _before(at: tuple[str, int], cut: tuple[str, int]) -> bool:
    """A log position ``at`` lies wholly before ``cut`` (older log files come first)."""
    return at[0] != cut[0] or at[1] <= cut[1]


def check_flip(run: Run, offset: int) -> str | None:
    """Flip the byte at ``offset`` of the newest log; returns what went wrong, if anything."""
    import vindex

    log = newest_log(run.path)
    flip(log, offset)
    with open(log, "rb") as f:
        damaged = f.read()
    for attempt in ("open", "second open"):
        try:
            vindex.Index.open(run.path).close()
        except vindex.CorruptionError as exc:
            if os.path.basename(log) not in str(exc):
                return f"flip at {offset}: the {attempt}'s CorruptionError does not name {log}: {exc}"
        else:
            return f"flip at {offset} of {log}: the {attempt} succeeded"
        with open(log, "rb") as f:
            if f.read() != damaged:
                return f"flip at {offset}: the failed {attempt} changed {log}"
    return None


def check_cut(run: Run, offset: int) -> str | None:
    """Truncate the newest log at ``offset``; returns what went wrong, if anything: an open
    that fails (or, before the checkpoint's records, one that succeeds), batches acknowledged
    before the cut missing, batches after it present, other bytes, a failed ``verify``.

    The block store reuses a released block once the release is synced, so a cut that takes
    synced records away (damage: a torn write never does) can leave the map pointing at
    blocks a cut commit rewrote; a read of them raises ``CorruptionError`` naming the data
    file, which counts as damage detected."""
    import vindex

    log = newest_log(run.path)
    os.truncate(log, offset)
    cut = (log, offset)
    covered = run.checkpoint is not None and not _before(run.checkpoint, cut)
    try:
        index = vindex.Index.open(run.path, rebalance=False)
    except vindex.CorruptionError as exc:
        return None if covered else f"cut at {offset} of {log}: open failed: {exc}"
    try:
        if covered:
            return f"cut at {offset}, before the checkpoint's records ({run.checkpoint[1]}): it opened"
        return _check_prefix(run, index, cut)
    except vindex.CorruptionError as exc:
        return None if run.store == "blocks" and "data file" in str(exc) else f"cut at {offset}: {exc}"
    finally:
        index.close()


def _check_prefix(run: Run, index, cut: tuple[str, int]) -> str | None:
    """What ``index`` holds after a cut at ``cut``: a prefix of the acknowledged batches, each
    with its vectors, every batch before the cut (RocksDB), and a clean ``verify``."""
    offset = cut[1]
    n = len(run.acked) + 1  # and the batch in flight when the child was killed
    ids = np.arange(n * BATCH)
    got, found = index.get(ids)
    present = found.reshape(n, BATCH)
    whole = present.all(axis=1)
    if not (whole | ~present.any(axis=1)).all():
        return f"cut at {offset}: a batch is half present"
    kept = int(np.argmin(whole)) if not whole.all() else n
    if whole[kept:].any():
        return f"cut at {offset}: batches present after missing batch {kept} (not a prefix of the log)"
    expected = sum(_before(at, cut) for at in run.acked)
    if kept > expected + 1 or (run.store == "rocksdb" and kept < expected):
        return f"cut at {offset}: {kept} batches present, {expected} were acknowledged before the cut"
    for i in range(min(kept, len(run.acked))):
        if not np.array_equal(got[i * BATCH:(i + 1) * BATCH], batch_vectors(run.seed, i)[1]):
            return f"cut at {offset}: batch {i} has other vectors"
    report = index.verify()
    if not report.ok:
        return f"cut at {offset}: verify: {report.violations}"
    return None


def cycles(path: str, n: int, rows: int, fractions: list[float], *, store: str = "rocksdb", seed: int = 0,
           log=print) -> dict:
    """``n`` cycles of write, kill and damage; returns counts and the problems found."""
    rng = np.random.default_rng(seed)
    out = {"cycles": n, "rows": rows, "fractions": fractions, "store": store,
           "flips": 0, "cuts": 0, "cuts_before_checkpoint": 0, "problems": []}
    for c in range(n):
        root = os.path.join(path, f"cycle{c}")
        run = write_and_kill(os.path.join(root, "idx"), rows, store=store, seed=seed + c, checkpoint_at=rows // 2 // BATCH * BATCH)
        size = os.path.getsize(newest_log(run.path))
        checks = [(check_flip, int(size * f), "flips") for f in fractions]
        start = run.checkpoint[1] if run.checkpoint and run.checkpoint[0] == newest_log(run.path) else 0
        checks.append((check_cut, int(rng.integers(start + 1, size)), "cuts"))
        if store == "rocksdb" and start > 1:
            checks.append((check_cut, int(rng.integers(1, start)), "cuts_before_checkpoint"))
        for k, (check, offset, counter) in enumerate(checks):
            problem = check(copy_of(run, os.path.join(root, f"damaged{k}")), offset)
            out[counter] += 1
            if problem:
                out["problems"].append(f"cycle {c}: {problem}")
        shutil.rmtree(root, ignore_errors=True)
        if log:
            log(f"cycle {c + 1}/{n}: {len(run.acked) * BATCH} rows acknowledged, {len(out['problems'])} problems")
    return out
