"""Full-disk harness: a server on a small tmpfs, written until the disk is full, then freed.

    python -m bench.fulldisk                      # as root: mounts a 64 MiB tmpfs; bench/results/fulldisk.json
    python -m bench.fulldisk --dir /mnt/small     # a small file system mounted already (any user)

Starts ``vindex serve`` on the small file system, fills it (a filler file takes all but
``--leave-mb``) and checks, phase by phase:

1. ``full``: upserts go on until one answers RESOURCE_EXHAUSTED saying the disk is full and
   that writes resume once space is freed; every acknowledged row reads back, searches answer;
2. ``resumed``: with the filler removed the next upsert succeeds, without a restart;
3. ``restarted-full``: filled again and the server restarted on the full disk, it serves the
   collection (every acknowledged row reads back), and upserts and CreateCollection answer
   RESOURCE_EXHAUSTED, the failed create leaving no directory;
4. ``resumed-after-restart``: with the filler removed upserts succeed again; after a last
   restart every acknowledged row is there and ``vindex verify`` passes;
5. the server's log holds no traceback while serving (closing a collection on the full disk
   cannot write its last checkpoint, and says so), and at most one "background round failed"
   line per kind of failure per minute.

Exits 1 if a check fails. Writes ``<out>/fulldisk.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

import grpc
import numpy as np

from .fuzz import ServerProc

NAME, DIM, BATCH = "full", 32, 500
GET_BATCH = 1000  # ids per Get, within the server's --max-rows
#: Longest a phase waits for a write to succeed once space is freed (the first write after a
#: failure reopens the store, which writes its logs out as tables).
RESUME_TIMEOUT_S = 60.0


@contextmanager
def small_disk(size_mb: int, given: str | None) -> Iterator[str]:
    """``given``, or a ``size_mb`` tmpfs mounted for the run (needs root)."""
    if given:
        yield given
        return
    mnt = tempfile.mkdtemp(prefix="vindex-fulldisk-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", mnt], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", mnt], check=False)
        os.rmdir(mnt)


def fill(disk: str, leave_bytes: int) -> str:
    """A file taking all but ``leave_bytes`` of ``disk``; remove it to free the space."""
    path = os.path.join(disk, "filler")
    st = os.statvfs(disk)
    with open(path, "wb") as f:
        f.write(bytes(max(0, st.f_bavail * st.f_frsize - leave_bytes)))
    return path


class Run:
    """One server on the small disk, the rows it acknowledged, and the checks' outcomes."""

    def __init__(self, disk: str, seed: int):
        self.disk, self.data = disk, os.path.join(disk, "data")
        self.server = ServerProc(self.data, os.path.join(tempfile.gettempdir(), f"vindex-fulldisk-{os.getpid()}.log"))
        self.rng = np.random.default_rng(seed)
        self.acked: dict[int, np.ndarray] = {}
        self.next_id = 0
        self.checks: dict[str, bool] = {}
        self.phases: dict[str, dict] = {}

    def start(self) -> None:
        from vindex.service import vindex_pb2_grpc as pb_grpc

        self.server.start()
        self.channel = grpc.insecure_channel(self.server.target)
        self.stub = pb_grpc.VectorIndexStub(self.channel)

    def stop(self) -> int:
        self.channel.close()
        rc, _ = self.server.stop()
        return rc

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks[name] = bool(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{': ' + detail if detail and not ok else ''}", flush=True)

    def upsert(self) -> grpc.RpcError | None:
        """One batch of new rows; the error it failed with, or None (then it is acknowledged)."""
        from vindex.service import vindex_pb2 as pb

        ids = np.arange(self.next_id, self.next_id + BATCH)
        x = self.rng.standard_normal((BATCH, DIM)).astype(np.float32)
        try:
            self.stub.Upsert(pb.UpsertRequest(collection=NAME, ids=ids.tolist(), vectors=x.astype("<f4").tobytes(),
                                              dim=DIM), timeout=60)
        except grpc.RpcError as err:
            return err
        self.acked.update(zip(ids.tolist(), x))
        self.next_id += BATCH
        return None

    def until_full(self, phase: str) -> None:
        started, failed = time.monotonic(), None
        for _ in range(100_000):
            failed = self.upsert()
            if failed is not None:
                break
        details = failed.details() if failed is not None else ""
        self.check(f"{phase}: RESOURCE_EXHAUSTED",
                   failed is not None and failed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"{failed.code() if failed else 'no failure'}: {details}")
        self.check(f"{phase}: says the disk is full and writes resume",
                   "disk is full" in details and "resume" in details, details)
        self.phases[phase] = {"acknowledged_rows": len(self.acked), "seconds": round(time.monotonic() - started, 2),
                              "details": details.replace(self.disk, "<disk>")}

    def resumes(self, phase: str) -> None:
        started, failed, refused = time.monotonic(), self.upsert(), []
        while failed is not None and time.monotonic() - started < RESUME_TIMEOUT_S:
            refused.append(failed.details().replace(self.disk, "<disk>"))
            time.sleep(0.5)
            failed = self.upsert()
        self.check(f"{phase}: writes resume", failed is None, failed.details() if failed else "")
        self.phases[phase] = {"seconds_to_resume": round(time.monotonic() - started, 2), "refused": refused}

    def all_kept(self, phase: str) -> None:
        import vindex

        ids = np.array(sorted(self.acked))
        with vindex.Client(self.server.target, timeout=120) as client:
            col = client.collection(NAME)
            parts = [col.get(ids[i:i + GET_BATCH]) for i in range(0, ids.size, GET_BATCH)]
            got, found = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
            same = bool(found.all()) and np.array_equal(got, np.stack([self.acked[i] for i in ids]))
            self.check(f"{phase}: every acknowledged row reads back", same,
                       f"{int((~found).sum())} of {ids.size} missing")
            res = col.search(self.rng.standard_normal((4, DIM)).astype(np.float32), 10)
            self.check(f"{phase}: searches answer", res.ids.shape == (4, 10))

    def create_refused(self, phase: str) -> None:
        from vindex.service import vindex_pb2 as pb

        try:
            self.stub.CreateCollection(pb.CreateCollectionRequest(name="another", dim=DIM), timeout=60)
            code = grpc.StatusCode.OK
        except grpc.RpcError as err:
            code = err.code()
        self.check(f"{phase}: CreateCollection RESOURCE_EXHAUSTED", code == grpc.StatusCode.RESOURCE_EXHAUSTED, str(code))
        self.check(f"{phase}: the failed create left no directory",
                   not os.path.exists(os.path.join(self.data, "collections", "another")))


def run(disk: str, seed: int, leave_bytes: int) -> Run:
    from vindex.service import vindex_pb2 as pb

    r = Run(disk, seed)
    r.start()
    r.stub.CreateCollection(pb.CreateCollectionRequest(name=NAME, dim=DIM), timeout=60)
    filler = fill(disk, leave_bytes)
    r.until_full("full")
    r.all_kept("full")
    os.remove(filler)
    r.resumes("resumed")
    filler = fill(disk, leave_bytes)
    r.until_full("refilled")
    r.stop()  # its last checkpoint may fail for lack of space: the log keeps everything
    r.start()
    r.all_kept("restarted-full")
    failed = r.upsert()
    r.check("restarted-full: upserts RESOURCE_EXHAUSTED",
            failed is not None and failed.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, str(failed and failed.code()))
    r.create_refused("restarted-full")
    os.remove(filler)
    r.resumes("resumed-after-restart")
    r.check("stops cleanly", r.stop() == 0)
    r.start()
    r.all_kept("final")
    r.check("final: stops cleanly", r.stop() == 0)
    verify = subprocess.run([sys.executable, "-m", "vindex", "verify", r.data], capture_output=True, text=True)
    r.check("vindex verify passes", verify.returncode == 0, verify.stdout + verify.stderr)
    log = r.server.log()
    # closing a collection on the full disk cannot write its last checkpoint (nothing is lost:
    # the log replays at the next start); the server logs that one with its traceback
    at_close = log.count("closing collection")
    r.check("no traceback while serving", log.count("Traceback") <= at_close, log[-3000:])
    rounds = log.count("background round failed")
    r.check("background failures rate-limited", rounds <= 4, f"{rounds} lines")
    r.phases["log"] = {"background_round_failed_lines": rounds, "close_checkpoint_failures": at_close,
                       "bytes": len(log)}
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64, help="size of the tmpfs mounted (without --dir)")
    ap.add_argument("--dir", default=None, help="a small file system mounted already, used instead of a tmpfs")
    ap.add_argument("--leave-mb", type=float, default=3.0, help="room the filler file leaves for the index")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    with small_disk(args.size_mb, args.dir) as disk:
        r = run(disk, args.seed, int(args.leave_mb * 2**20))
        shutil.rmtree(os.path.join(disk, "data"), ignore_errors=True)
    out = {"size_mb": args.size_mb if not args.dir else None, "leave_mb": args.leave_mb, "seed": args.seed,
           "ok": all(r.checks.values()), "checks": r.checks, "phases": r.phases}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fulldisk.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps({k: out[k] for k in ("ok", "phases")}, indent=2))
    sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    main()
