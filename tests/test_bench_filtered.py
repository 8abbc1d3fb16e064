"""bench.filtered: its workload (filter dicts against their masks), exact filtered truth, recall,
the engines on a small set, and a smoke run of the whole script."""
from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

from bench import filter_workload, filtered, filtered_truth
from bench.filtered_engines import FaissIVFBitmap, HnswlibFilter, Unsupported, VindexFiltered
from bench.filtered_upsert import DOCUMENT_BYTES, document
from bench.peers import _prepare

RNG = np.random.default_rng(3)
N, NQ, D = 3000, 40, 16


def _oracle(flt: dict | None, meta: dict) -> bool:
    """The filter semantics of the contract, for the operators the workload uses."""
    if flt is None:
        return True
    for key, cond in flt.items():
        ops = cond if isinstance(cond, dict) else {"$eq": cond}
        value = meta.get(key)
        for op, arg in ops.items():
            ok = {"$eq": lambda: value == arg, "$lt": lambda: value < arg,
                  "$gte": lambda: value >= arg}[op]()
            if not ok:
                return False
    return True


@pytest.fixture(scope="module")
def small():
    base = _prepare(RNG.normal(size=(N, D)).astype(np.float32), "cosine")
    queries = _prepare(RNG.normal(size=(NQ, D)).astype(np.float32), "cosine")
    topics = RNG.integers(0, 4, N)
    work = filter_workload.make(base, queries, "cosine", n_clusters=20, topics=topics,
                                topic_names=["a", "b", "c", "d"], chunks=np.arange(N) % 7,
                                titles=[f"t{i}" for i in range(N)])
    truths = [filtered_truth.exact(base, queries, "cosine", c, 10) for c in work.cases]
    return base, queries, work, truths


def test_every_filter_dict_selects_exactly_its_mask(small):
    _, _, work, _ = small
    assert len(work.metadata[0]) == 5
    for case in work.cases:
        for flt, mask in zip(case.filters, case.masks):
            assert [_oracle(flt, m) for m in work.metadata] == mask.tolist(), case.name


def test_label_selectivities_are_exact(small):
    _, _, work, _ = small
    labels = [c for c in work.cases if c.kind == "label"]
    assert [c.masks.sum() for c in labels] == [math.ceil(s * N) for s in filter_workload.SELECTIVITIES]
    year = next(c for c in work.cases if c.kind == "range")
    assert 0.03 < year.selectivity < 0.07


def test_far_clusters_lie_away_from_their_queries(small):
    base, queries, work, _ = small
    far = next(c for c in work.cases if c.kind == "far-cluster")
    near_sim = far_sim = 0.0
    for i in range(NQ):
        sims = base[far.masks[far.which[i]]] @ queries[i]
        far_sim += sims.mean()
        near_sim += np.sort(base @ queries[i])[-len(sims):].mean()
    assert far_sim < 0 < near_sim  # the chosen cluster sits on the far side of the sphere


def test_exact_truth_matches_a_sort_of_the_matching_rows(small):
    base, queries, work, truths = small
    for case, truth in zip(work.cases, truths):
        for i in range(0, NQ, 7):
            rows = np.flatnonzero(case.masks[case.which[i]])
            dist = -(base[rows] @ queries[i])
            want = rows[np.lexsort((rows, dist))][:10]
            assert truth[i, :len(want)].tolist() == want.tolist(), case.name
            assert (truth[i, len(want):] == -1).all()


def test_ties_go_to_the_smaller_id_and_short_results_pad():
    dist = np.array([[1.0, 0.5, 0.5, 0.5, 2.0]], dtype=np.float32)
    ids = np.array([10, 40, 30, 20, 50])
    assert filtered_truth.top_k(dist, ids, 2).tolist() == [[20, 30]]
    assert filtered_truth.top_k(dist, ids, 7).tolist() == [[20, 30, 40, 10, 50, -1, -1]]


def test_recall_scores_short_truth_against_what_exists():
    truth = np.array([[1, 2, -1, -1], [5, 6, 7, 8], [-1, -1, -1, -1]])
    found = np.array([[2, 9, 9, -1], [5, 6, 0, 0], [3, 4, 5, 6]])
    assert filtered_truth.recall(found, truth) == pytest.approx((0.5 + 0.5) / 2)


def _run(engine, case, queries, k=10):
    engine.prepare(case)
    return np.stack([engine.search_one(queries[i], i, k) for i in range(len(queries))])


def test_brute_force_equals_the_truth_on_every_case(small):
    base, queries, work, truths = small
    bf = filtered_truth.BruteForce()
    bf.build(base, "cosine", work)
    for case, truth in zip(work.cases, truths):
        assert _run(bf, case, queries).tolist() == truth.tolist(), case.name


HAS_HNSWLIB = importlib.util.find_spec("hnswlib") is not None  # the bench extra, not the test one


@pytest.mark.parametrize("cls", [FaissIVFBitmap, pytest.param(HnswlibFilter, marks=pytest.mark.skipif(
    not HAS_HNSWLIB, reason="hnswlib comes with the bench extra (pip install -e '.[bench]')"))])
def test_peers_return_only_matching_rows_and_find_the_truth(small, cls):
    base, queries, work, truths = small
    engine = cls(build_threads=1)
    engine.build(base, "cosine", work)
    engine.set_params(engine.sweep()[-1])  # widest setting: every list / the largest ef
    for case, truth in zip(work.cases, truths):
        found = _run(engine, case, queries)
        for i in range(NQ):
            got = found[i][found[i] >= 0]
            assert case.masks[case.which[i]][got].all(), case.name
        assert filtered_truth.recall(found, truth) >= (1.0 if cls is FaissIVFBitmap else 0.9), case.name
    engine.close()


def test_vindex_filtered_search_at_all_postings_is_exact(small, tmp_path):
    base, queries, work, truths = small
    engine = VindexFiltered(str(tmp_path / "ix"), build_threads=1)
    try:
        engine.build(base, "cosine", work)
    except Unsupported as e:
        pytest.skip(str(e))
    engine.set_params({"max_postings": 4096})
    for case, truth in zip(work.cases, truths):
        found = _run(engine, case, queries)
        assert filtered_truth.recall(found, truth) == 1.0, case.name
    engine.close()


def test_documents_are_500_ascii_bytes():
    assert len(document(3, "Aaron Copland").encode()) == DOCUMENT_BYTES
    assert len(document(3, "Zürich").encode()) == DOCUMENT_BYTES
    assert document(7, None).startswith("row 7. ")


def test_quick_run_writes_every_case_for_every_engine(tmp_path):
    peers = ["faiss-ivfflat", "brute-force"] + (["hnswlib"] if HAS_HNSWLIB else [])
    assert filtered.main(["--quick", "--out", str(tmp_path), "--engines", ",".join(["vindex", *peers])]) == 0
    res = json.loads((tmp_path / "filtered-quick.json").read_text())
    wiki = res["datasets"]["wiki-minilm-15k"]
    names = [c["name"] for c in wiki["search"]["cases"]]
    assert names[0] == "unfiltered" and "topic" in names and "far cluster" in names
    engines = wiki["search"]["engines"]
    for name in ["vindex", *peers]:
        assert set(engines[name]["cases"]) == set(names)
    assert all(rows[0]["recall"] == 1.0 for rows in engines["brute-force"]["cases"].values())
    assert [r["case"] for r in wiki["search"]["summary"]] == names
    assert wiki["upsert"]["plain_rows_s"] > 0
    assert wiki["upsert"]["metadata_rows_s"] > 0
    assert wiki["upsert"]["columns_rows_s"] > 0


def test_summary_takes_vindex_at_its_unfiltered_095_setting_and_peers_at_the_same_recall():
    cases = [filter_workload.unfiltered_case(100, 4),
             filter_workload.FilterCase("f", "label", [{"label": {"$lt": 1}}],
                                        np.arange(100)[None, :] < 10, np.zeros(4, dtype=np.int64))]

    def rows(case, pts):
        return [{"case": case, "setting": i, "params": f"p={i}", "recall": r, "qps": q}
                for i, (r, q) in enumerate(pts)]

    engines = {
        "vindex": {"setting_at_0.95_unfiltered": 1,
                   "cases": {"unfiltered": rows("unfiltered", [(0.9, 900), (0.96, 600)]),
                             "f": rows("f", [(0.97, 800), (0.98, 500), (1.0, 100)])}},
        "faiss-ivfflat": {"cases": {"unfiltered": rows("unfiltered", [(0.9, 400), (1.0, 200)]),
                                    "f": rows("f", [(0.96, 300), (1.0, 100)])}},
        "hnswlib": {"skipped": "no"},
        "brute-force": {"cases": {"unfiltered": rows("unfiltered", [(1.0, 50)]), "f": rows("f", [(1.0, 250)])}},
    }
    un, f = filtered.summarize(cases, engines)
    assert (f["vindex_params"], f["vindex_recall"], f["vindex_qps"]) == ("p=1", 0.98, 500)
    assert f["faiss_qps"] == pytest.approx(200)  # 0.98: halfway between (0.96, 300) and (1.0, 100)
    assert f["x_faiss"] == pytest.approx(2.5) and f["x_brute"] == pytest.approx(2.0)
    assert "hnswlib_qps" not in f
    assert un["faiss_qps"] == pytest.approx(280) and un["min_matches"] == 100
    assert f["selectivity"] == pytest.approx(0.1)
    assert "| f | 10.0000% |" in filtered.markdown([f])


def test_a_search_run_keeps_the_last_upsert_rates(tmp_path):
    """filtered.json holds both modes: a --mode search run carries the upsert table over, and
    the data sets it did not run."""
    path = tmp_path / "filtered.json"
    path.write_text(json.dumps({"datasets": {"a": {"upsert": {"ratio": 0.5}, "search": {"old": 1}},
                                             "b": {"upsert": {"ratio": 0.7}}}}))
    result = {"datasets": {"a": {"search": {"new": 1}}, "c": {"search": {}}}}
    filtered.keep_other_mode(str(path), result)
    assert result["datasets"] == {"a": {"search": {"new": 1}, "upsert": {"ratio": 0.5}}, "c": {"search": {}},
                                  "b": {"upsert": {"ratio": 0.7}}}
