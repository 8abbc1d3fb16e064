"""A hypothesis state machine drives upserts, deletes, searches, gets, waits and reopens
against a plain dict, with background rebalancing running; an exhaustive search must equal
brute force over the live set after every step."""
from __future__ import annotations

import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import vindex
from conftest import brute_force

DIM = 4
ALL = dict(max_postings=4096, eps=float("inf"), ef=4096)
# 4-d records are 24 bytes: a 1 KiB budget holds 42 vectors, so a few batches force splits
CONFIG = dict(posting_limit_bytes=1024, checkpoint_every=300)

ids_st = st.lists(st.integers(0, 150), min_size=1, max_size=40, unique=True)


def vectors_st(n: int):
    # small integers: float32 distances are exact, so results compare exactly, ties by id
    return st.lists(st.lists(st.integers(0, 7), min_size=DIM, max_size=DIM), min_size=n, max_size=n)


class IndexMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="vindex-sm-")
        self.path = self.dir + "/index"
        self.index = vindex.Index.create(self.path, dim=DIM, **CONFIG)
        self.model: dict[int, np.ndarray] = {}

    @rule(ids=ids_st, data=st.data())
    def upsert(self, ids, data):
        x = np.asarray(data.draw(vectors_st(len(ids))), dtype=np.float32)
        self.index.upsert(ids, x)
        self.model.update(zip(ids, x))

    @rule(ids=ids_st, data=st.data())
    def add(self, ids, data):
        x = np.asarray(data.draw(vectors_st(len(ids))), dtype=np.float32)
        clash = sorted(i for i in ids if i in self.model)
        if clash:
            try:
                self.index.add(ids, x)
            except vindex.DuplicateIdError as err:
                assert err.ids == clash
            else:
                raise AssertionError("add of live ids must fail")
        else:
            self.index.add(ids, x)
            self.model.update(zip(ids, x))

    @rule(ids=st.lists(st.integers(0, 160), max_size=30, unique=True))
    def delete(self, ids):
        expect = sum(i in self.model for i in ids)
        assert self.index.delete(ids) == expect
        for i in ids:
            self.model.pop(i, None)

    @rule(data=st.data())
    def search(self, data):
        q = np.asarray(data.draw(vectors_st(3)), dtype=np.float32)
        got, dists = self.index.search(q, 8, **ALL)
        if not self.model:
            assert (got == -1).all()
            return
        ids = np.array(sorted(self.model), dtype=np.int64)
        base = np.stack([self.model[i] for i in ids])
        k = min(8, ids.size)
        want, want_d = brute_force(base, q, k, ids=ids)
        np.testing.assert_array_equal(got[:, :k], want)
        np.testing.assert_array_equal(dists[:, :k], want_d.astype(np.float32))
        assert (got[:, k:] == -1).all()

    @rule(ids=ids_st)
    def get(self, ids):
        vecs, found = self.index.get(ids)
        for i, v, f in zip(ids, vecs, found):
            assert f == (i in self.model)
            if f:
                np.testing.assert_array_equal(v, self.model[i])

    @rule()
    def wait_idle(self):
        assert self.index.wait_idle(timeout=60)
        s = self.index.stats()
        assert s["postings_over_limit"] == 0 and s["posting_max"] <= s["posting_limit"]
        assert s["background_errors"] == 0
        report = self.index.verify()  # idle: posting limits are checked too
        assert report.ok, str(report)

    @rule()
    def verify(self):  # rebalancing may be running: every invariant but the limits holds
        report = self.index.verify()
        assert report.ok, str(report)

    @precondition(lambda self: True)
    @rule()
    def reopen(self):
        self.index.close()
        self.index = vindex.Index.open(self.path)

    @invariant()
    def size(self):
        assert len(self.index) == len(self.model)

    def teardown(self):
        self.index.close()
        shutil.rmtree(self.dir, ignore_errors=True)


_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestIndexStateMachine(IndexMachine.TestCase):
    settings = settings(max_examples=60, stateful_step_count=30, **_common)


@pytest.mark.slow
class TestIndexStateMachineLong(IndexMachine.TestCase):
    settings = settings(max_examples=600, stateful_step_count=50, **_common)
