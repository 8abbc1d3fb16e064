"""Linux I/O plumbing for the block store: a minimal io_uring through ctypes, I/O priorities,
and ``RingScheduler``, which serves each I/O class from its own ring.

Why ctypes and not a package: the store needs a handful of calls (set up a ring, map it, queue
reads, enter the kernel, register an eventfd), and ctypes calls release the GIL.

The ring, as the kernel shares it (see io_uring(7)):

* ``io_uring_setup`` (syscall 425) returns a fd and, in ``io_uring_params``, the offsets of the
  submission (SQ) and completion (CQ) rings inside three mappings of that fd;
* we write a 64-byte SQE per read into the SQE array, put its index in the SQ index array,
  bump the SQ tail, and ``io_uring_enter`` (426) makes the kernel consume them;
* the kernel writes a 16-byte CQE ``(user_data, res, flags)`` per finished read, bumps the CQ
  tail and, with an eventfd registered (``io_uring_register`` 427), signals it.

The worker thread of a ring sleeps in ``poll`` on that eventfd (GIL released); submitters
write to the same eventfd, so one wait covers "new work" and "reads done".

Memory ordering: head/tail are plain loads and stores from Python. The kernel reads the SQ
tail inside ``io_uring_enter`` on our own thread, so SQ stores are ordered on any CPU; the CQ
side (tail, then the CQEs) needs acquire loads, which x86-64's total store order gives for
free. Rings are therefore only used on x86-64; elsewhere the store falls back to ``preadv``.
"""
from __future__ import annotations

import ctypes
import errno as errno_codes
import itertools
import logging
import mmap
import os
import platform
import select
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from ..iosched import IOScheduler
from .base import IOClass

log = logging.getLogger("vindex.storage.blocks")

_SYS_SETUP, _SYS_ENTER, _SYS_REGISTER = 425, 426, 427
_SYS_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(platform.machine())
_SYS_IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_OP_READV = 1                 # since 5.1 (IORING_OP_READ needs 5.6; one iovec costs nothing)
_REGISTER_EVENTFD = 4
_ENTER_GETEVENTS = 1
_ENTRIES = 128

# ioprio: class in the top 3 bits of 16, level below. BE (best effort) levels 0..7 need no
# privilege; RT would need CAP_SYS_ADMIN, and IDLE starved background work in our
# measurements (DESIGN.md), so background is BE 7 and the token bucket does the pacing.
_IOPRIO_CLASS_BE = 2
_IOPRIO_WHO_PROCESS = 1


def ioprio(cls: int, level: int) -> int:
    return (cls << 13) | level


CLASS_IOPRIO = {IOClass.INTERACTIVE: ioprio(_IOPRIO_CLASS_BE, 0),
                IOClass.UPDATE: ioprio(_IOPRIO_CLASS_BE, 4),
                IOClass.BACKGROUND: ioprio(_IOPRIO_CLASS_BE, 7)}

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(nr: int, *args: int) -> int:
    """``syscall(nr, args...)``; raises OSError on -1. Releases the GIL while in the kernel."""
    res = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if res < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


@contextmanager
def thread_ioprio(value: int | None) -> Iterator[None]:
    """Run the block with the calling thread's I/O priority set to ``value`` (None: leave it),
    then restore it: a preadv may run on a caller's own thread (``IOScheduler.run`` runs a
    request inline when its pool is idle), whose priority must not stay changed."""
    old = None
    if value is not None and _SYS_IOPRIO_SET is not None:
        try:
            old = _syscall(_SYS_IOPRIO_GET, _IOPRIO_WHO_PROCESS, 0)
            if old != value:
                _syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, 0, value)  # who=0: this thread
            else:
                old = None
        except OSError:
            old = None
    try:
        yield
    finally:
        if old is not None:
            try:
                _syscall(_SYS_IOPRIO_SET, _IOPRIO_WHO_PROCESS, 0, old)
            except OSError:
                pass


# --- the kernel's structures --------------------------------------------------------------------
_u8, _u16, _u32, _u64, _i32 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32


class _SQOffsets(ctypes.Structure):
    _fields_ = [("head", _u32), ("tail", _u32), ("ring_mask", _u32), ("ring_entries", _u32),
                ("flags", _u32), ("dropped", _u32), ("array", _u32), ("resv1", _u32), ("user_addr", _u64)]


class _CQOffsets(ctypes.Structure):
    _fields_ = [("head", _u32), ("tail", _u32), ("ring_mask", _u32), ("ring_entries", _u32),
                ("overflow", _u32), ("cqes", _u32), ("flags", _u32), ("resv1", _u32), ("user_addr", _u64)]


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", _u32), ("cq_entries", _u32), ("flags", _u32), ("sq_thread_cpu", _u32),
                ("sq_thread_idle", _u32), ("features", _u32), ("wq_fd", _u32), ("resv", _u32 * 3),
                ("sq_off", _SQOffsets), ("cq_off", _CQOffsets)]


class _SQE(ctypes.Structure):
    _fields_ = [("opcode", _u8), ("flags", _u8), ("ioprio", _u16), ("fd", _i32), ("off", _u64),
                ("addr", _u64), ("len", _u32), ("rw_flags", _u32), ("user_data", _u64),
                ("buf_index", _u16), ("personality", _u16), ("splice_fd_in", _i32), ("addr3", _u64),
                ("pad", _u64)]


class _CQE(ctypes.Structure):
    _fields_ = [("user_data", _u64), ("res", _i32), ("flags", _u32)]


assert ctypes.sizeof(_Params) == 120 and ctypes.sizeof(_SQE) == 64 and ctypes.sizeof(_CQE) == 16
_SQE_SIZE = ctypes.sizeof(_SQE)
_ZERO_SQE = bytes(_SQE_SIZE)


class Ring:
    """One io_uring, with an eventfd unless ``eventfd=False`` (a ring whose user waits in
    ``submit_and_wait``); used by one thread at a time."""

    def __init__(self, entries: int = _ENTRIES, *, eventfd: bool = True):
        if platform.machine() != "x86_64":
            raise OSError(errno_codes.ENOSYS, "io_uring rings are only used on x86-64 (see module docstring)")
        p = _Params()
        self.fd = _syscall(_SYS_SETUP, entries, ctypes.addressof(p))
        self._maps: list[mmap.mmap] = []
        self.efd = -1
        try:
            self._map_rings(p)
            if eventfd:
                self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
                efd = ctypes.c_int32(self.efd)
                _syscall(_SYS_REGISTER, self.fd, _REGISTER_EVENTFD, ctypes.addressof(efd), 1)
        except BaseException:
            self.close()
            raise
        self._poll = select.poll()
        if eventfd:
            self._poll.register(self.efd, select.POLLIN)
        self.capacity = p.sq_entries  # reads in flight at most (the CQ holds twice that)
        self.inflight = 0
        self._tail = self._sq_tail.value

    def _map_rings(self, p: _Params) -> None:
        def mapping(size: int, offset: int) -> mmap.mmap:
            m = mmap.mmap(self.fd, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                          mmap.PROT_READ | mmap.PROT_WRITE, offset=offset)
            self._maps.append(m)
            return m

        sq, cq = p.sq_off, p.cq_off
        sq_ring = mapping(sq.array + p.sq_entries * 4, _OFF_SQ_RING)
        cq_ring = mapping(cq.cqes + p.cq_entries * ctypes.sizeof(_CQE), _OFF_CQ_RING)
        sqes = mapping(p.sq_entries * ctypes.sizeof(_SQE), _OFF_SQES)
        self._sq_head = _u32.from_buffer(sq_ring, sq.head)
        self._sq_tail = _u32.from_buffer(sq_ring, sq.tail)
        self._sq_mask = _u32.from_buffer(sq_ring, sq.ring_mask).value
        self._sq_array = (_u32 * p.sq_entries).from_buffer(sq_ring, sq.array)
        self._sqes = (_SQE * p.sq_entries).from_buffer(sqes)
        self._sqe_map = sqes
        self._cq_head = _u32.from_buffer(cq_ring, cq.head)
        self._cq_tail = _u32.from_buffer(cq_ring, cq.tail)
        self._cq_mask = _u32.from_buffer(cq_ring, cq.ring_mask).value
        self._cqes = (_CQE * p.cq_entries).from_buffer(cq_ring, cq.cqes)

    def room(self) -> int:
        return self.capacity - self.inflight

    def prep_readv(self, fd: int, iovec_addr: int, offset: int, user_data: int, prio: int) -> None:
        """Queue a read of one iovec (not yet visible to the kernel: ``submit`` does that)."""
        i = self._tail & self._sq_mask
        self._sqe_map[i * _SQE_SIZE:(i + 1) * _SQE_SIZE] = _ZERO_SQE  # not ctypes.memset: it releases the GIL
        sqe = self._sqes[i]
        sqe.opcode, sqe.ioprio, sqe.fd, sqe.off = _OP_READV, prio, fd, offset
        sqe.addr, sqe.len, sqe.user_data = iovec_addr, 1, user_data
        self._sq_array[i] = i
        self._tail = (self._tail + 1) & 0xFFFFFFFF
        self.inflight += 1

    def submit(self) -> None:
        """Publish queued SQEs and let the kernel consume them (one syscall for all)."""
        self._sq_tail.value = self._tail
        todo = (self._tail - self._sq_head.value) & 0xFFFFFFFF
        if todo:
            try:
                _syscall(_SYS_ENTER, self.fd, todo, 0, 0, 0, 0)
            except OSError as exc:
                if exc.errno not in (errno_codes.EINTR, errno_codes.EAGAIN, errno_codes.EBUSY):
                    raise
                # left in the ring: the next submit passes them again

    def submit_and_wait(self, n: int) -> None:
        """Publish queued SQEs and sleep in the kernel (GIL released) until ``n`` reads are
        done, in one syscall."""
        self._sq_tail.value = self._tail
        while True:
            ready = (self._cq_tail.value - self._cq_head.value) & 0xFFFFFFFF
            todo = self.pending()
            if ready >= n and not todo:
                return
            try:
                _syscall(_SYS_ENTER, self.fd, todo, max(0, n - ready), _ENTER_GETEVENTS, 0, 0)
            except OSError as exc:
                if exc.errno not in (errno_codes.EINTR, errno_codes.EAGAIN, errno_codes.EBUSY):
                    raise

    def pending(self) -> int:
        """SQEs written but not yet consumed by the kernel."""
        return (self._tail - self._sq_head.value) & 0xFFFFFFFF

    def completions(self) -> list[tuple[int, int]]:
        """``(user_data, result)`` of every finished read since the last call."""
        head, tail = self._cq_head.value, self._cq_tail.value
        out = []
        while head != tail:
            cqe = self._cqes[head & self._cq_mask]
            out.append((cqe.user_data, cqe.res))
            head = (head + 1) & 0xFFFFFFFF
        self._cq_head.value = head
        self.inflight -= len(out)
        return out

    def wait(self, timeout: float | None) -> None:
        """Sleep (GIL released) until a completion or a ``wake``, or ``timeout`` seconds."""
        if self._poll.poll(None if timeout is None else max(1, int(timeout * 1000))):
            try:
                os.eventfd_read(self.efd)
            except BlockingIOError:
                pass

    def wake(self) -> None:
        os.eventfd_write(self.efd, 1)

    def close(self) -> None:
        # the ctypes views export the mappings' buffers: drop them before unmapping
        for name in ("_sq_head", "_sq_tail", "_sq_array", "_sqes", "_sqe_map", "_cq_head", "_cq_tail", "_cqes"):
            self.__dict__.pop(name, None)
        for m in self._maps:
            m.close()
        self._maps.clear()
        for fd in (self.efd, self.fd):
            if fd >= 0:
                os.close(fd)
        self.efd = self.fd = -1


# --- the scheduler ------------------------------------------------------------------------------
def _iovecs(job: Any) -> np.ndarray:
    """One iovec per run of a read job: (address, length) pairs the kernel reads at submission
    (keep the array alive until then)."""
    iov = np.empty((job.runs.shape[0], 2), dtype=np.uint64)
    iov[:, 0] = job.address + job.runs[:, 1]
    iov[:, 1] = job.runs[:, 2]
    return iov


class _Job:
    """A read request in flight: its runs (file offset, length, destination address)."""

    def __init__(self, req: Any):
        job = req.fn
        self.req = req
        self.fd = job.fd
        self.runs = job.runs.tolist()
        self.iov = _iovecs(job)
        self.next = 0         # next run to queue
        self.remaining = len(self.runs)
        self.error: BaseException | None = None


#: Entries of a caller's own ring (reads of one inline request go in waves of this many).
_INLINE_ENTRIES = 64


class _OwnRing:
    """A thread's own ring for inline reads; closed when its thread ends (the thread-local
    holding it goes) or when the scheduler closes, whichever is first."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # held while reading: close() waits for a read in flight
        self.closed = False
        self.ring: Ring | None = Ring(_INLINE_ENTRIES, eventfd=False)

    def read(self, job: Any, prio: int) -> None:
        with self.lock:
            if self.closed:
                raise OSError(errno_codes.EBADF, "I/O scheduler is closed")
            if self.ring is None:  # dropped after a failed read
                self.ring = Ring(_INLINE_ENTRIES, eventfd=False)
            ring = self.ring
            iov = _iovecs(job)
            base, rows = iov.ctypes.data, job.runs.tolist()
            short = None
            try:
                for lo in range(0, len(rows), ring.capacity):
                    hi = min(len(rows), lo + ring.capacity)
                    for j in range(lo, hi):
                        ring.prep_readv(job.fd, base + 16 * j, rows[j][0], j, prio)
                    ring.submit_and_wait(hi - lo)
                    for j, res in ring.completions():
                        if res != rows[j][2] and short is None:
                            short = (OSError(-res, os.strerror(-res)) if res < 0 else
                                     OSError(errno_codes.EIO, f"short read: {res} of {rows[j][2]} bytes"))
            except BaseException:  # reads may still be queued or in flight: the ring is not reused
                self._close()
                raise
            if short is not None:
                raise short

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self._close()

    def _close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def __del__(self) -> None:
        self._close()


class _InlineRead:
    """A read job that, run by ``IOScheduler.run`` on the caller's thread, reads on that
    thread's own ring; queued, the class's ring thread reads its runs like any job's."""

    __slots__ = ("sched", "job", "prio", "fd", "address", "runs")

    def __init__(self, sched: "RingScheduler", job: Any, prio: int):
        self.sched, self.job, self.prio = sched, job, prio
        self.fd, self.address, self.runs = job.fd, job.address, job.runs

    def __call__(self) -> None:
        own = self.sched._own_ring()
        if own is None:  # no ring for this thread (out of locked memory, say): preadv
            self.job()
        else:
            own.read(self, self.prio)


class RingScheduler(IOScheduler):
    """``IOScheduler`` whose workers run reads on io_uring rings instead of calling ``fn``.

    The queues, deadlines, pacing and quotas are the parent's; each worker owns one ring
    (``sla``: one per class, SQEs tagged with the class's ioprio; ``fifo``: one shared ring,
    no priorities) and keeps up to the ring's capacity of reads in flight. A request's ``fn``
    is a read job exposing ``fd``, ``address`` (of the destination buffer) and ``runs``
    (an ``(n, 3)`` int64 array of file offset, buffer offset, length); its future gets None or
    an OSError.
    """

    def __init__(self, mode: str = "sla", **kw: Any):
        keys = [None] if mode == "fifo" else list(IOClass)
        self._rings: dict[IOClass | None, Ring] = {}
        try:
            for k in keys:
                self._rings[k] = Ring()
        except BaseException:
            for r in self._rings.values():
                r.close()
            raise
        self._fatal: BaseException | None = None
        self._local = threading.local()
        self._own_rings: weakref.WeakSet[_OwnRing] = weakref.WeakSet()
        try:
            super().__init__(mode, workers={IOClass.INTERACTIVE: 1}, **kw)  # one thread per ring
        except BaseException:
            for r in self._rings.values():
                r.close()
            raise

    def run(self, io: IOClass, fn: Callable[[], Any], **kw: Any) -> Any:
        """When the class has nothing queued and a slot free (the parent's rule), the caller
        reads on a ring of its own thread and waits in the kernel: the GIL is handed back
        once. Through the class's ring thread a read costs four hand-offs (the thread wakes
        to submit, wakes to reap and completes the future, then the caller wakes), and on a
        busy interpreter each waits up to a switch interval."""
        prio = 0 if self.mode == "fifo" else CLASS_IOPRIO[io]
        return super().run(io, _InlineRead(self, fn, prio), **kw)

    def _own_ring(self) -> _OwnRing | None:
        own = getattr(self._local, "ring", None)
        if own is None and not getattr(self._local, "failed", False):
            with self._cv:
                if self._stop:
                    return None
                try:
                    own = self._local.ring = _OwnRing()
                except OSError as exc:
                    log.info("no io_uring ring for thread %s (%s): its inline reads use preadv",
                             threading.current_thread().name, exc)
                    self._local.failed = True
                    return None
                self._own_rings.add(own)
        return own

    def submit(self, io: IOClass, fn: Callable[[], Any], **kw: Any):
        fut = super().submit(io, fn, **kw)
        try:
            self._rings[None if self.mode == "fifo" else io].wake()
        except OSError:  # closed meanwhile: close() failed the request already
            pass
        return fut

    def _work(self, io: IOClass | None) -> None:
        ring = self._rings[io]
        prio = 0 if io is None else CLASS_IOPRIO[io]
        inflight: dict[int, tuple[_Job, int]] = {}  # user_data -> (job, run length)
        queued: list[_Job] = []                     # popped, runs left to put in the ring
        ids = itertools.count(1)
        while True:
            for ud, res in ring.completions():
                job, n = inflight.pop(ud)
                if res != n and job.error is None:
                    job.error = (OSError(-res, os.strerror(-res)) if res < 0
                                 else OSError(errno_codes.EIO, f"short read: {res} of {n} bytes"))
                job.remaining -= 1
                if job.remaining == 0:
                    self._finish(job)
            stop, wait = self._take(io, queued)
            while queued and ring.room():
                job = queued[0]
                off, _, n = job.runs[job.next]
                ud = next(ids)
                inflight[ud] = (job, n)
                ring.prep_readv(job.fd, job.iov.ctypes.data + 16 * job.next, off, ud, prio)
                job.next += 1
                if job.next == len(job.runs):
                    queued.pop(0)
            if io != IOClass.INTERACTIVE and ring.pending():
                self.yield_to_interactive()
            try:
                ring.submit()
            except OSError as exc:  # the ring is unusable: fail what it holds, refuse the rest
                log.error("io_uring submit failed: %s", exc)
                self._fatal = exc
                for job, _ in list(inflight.values()) + [(j, 0) for j in queued]:
                    if job.remaining > 0:
                        job.remaining, job.error = 0, exc
                        self._finish(job)
                inflight.clear()
                queued.clear()
            if stop and not inflight and not queued:
                return
            ring.wait(wait if wait and not inflight and not queued else None)

    def _take(self, io: IOClass | None, queued: list[_Job]) -> tuple[bool, float]:
        """Pop as many requests as the ring has room for. Returns (stopping, seconds until
        the background bucket allows the next one)."""
        with self._cv:
            if self._stop:
                return True, 0.0
            now = self.clock()
            if io == IOClass.BACKGROUND:
                self.aimd.tick(now)
            room = self._rings[io].room() - sum(len(j.runs) - j.next for j in queued)
            while room > 0:
                req, expired, wait = self.queues.pop(io, now)
                self._fail_expired(expired)
                if req is None:
                    return False, wait
                if not req.future.set_running_or_notify_cancel():
                    continue
                if self._fatal is not None:
                    req.future.set_exception(self._fatal)
                    continue
                job = _Job(req)
                if job.remaining == 0:
                    req.future.set_result(None)
                    continue
                queued.append(job)
                room -= len(job.runs)
            return False, 0.0

    def _finish(self, job: _Job) -> None:
        req = job.req
        if job.error is None:
            req.future.set_result(None)
        else:
            req.future.set_exception(job.error)
        with self._cv:
            self._count_done(req.io, req.submitted)

    def close(self) -> None:
        with self._cv:
            self._stop = True
        for ring in self._rings.values():
            ring.wake()
        super().close()  # fails what is still queued, joins the workers (they finish in-flight reads)
        for ring in self._rings.values():
            ring.close()
        for own in list(self._own_rings):
            own.close()  # waits for a read in flight on it

