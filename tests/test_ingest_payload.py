"""``vindex ingest`` of record files (.parquet, .jsonl): ids, vectors, metadata and documents.

The readers first (columns, types, resuming at a row, every malformed input named by its row),
then the command against an in-process server: what it stores equals the file, and a run
stopped after some acknowledged chunks resumes where they left off without re-sending them.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

import test_service_payload  # noqa: E402
from vindex.service import cli  # noqa: E402
from vindex.service.client import Collection  # noqa: E402
from vindex.service.ingest import progress_path  # noqa: E402
from vindex.service.recordfiles import RecordError, open_records  # noqa: E402

DIM = 8
N = 50


def rows(n: int = N, str_ids: bool = True, seed: int = 0) -> list[dict]:
    """Records with every kind of metadata value, some rows without metadata or document."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n):
        rec = {"id": f"doc-{r // 5}#{r % 5}" if str_ids else r * 3,
               "vector": rng.standard_normal(DIM).astype(np.float32).tolist()}
        if r % 7:
            rec["metadata"] = {"source": f"s{r % 4}.pdf", "page": r, "score": r / 4, "tags": ["a", f"t{r % 3}"],
                               "nested": {"ok": bool(r % 2)}}
        if r % 5:
            rec["document"] = f"text of chunk {r} " * (r % 3 + 1)
        out.append(rec)
    return out


def write_jsonl(path, records: list[dict], blank_every: int = 0) -> str:
    with open(path, "w") as f:
        for i, rec in enumerate(records):
            f.write(json.dumps(rec) + "\n")
            if blank_every and i % blank_every == 0:
                f.write("\n")
    return str(path)


def write_parquet(path, records: list[dict], *, fixed: bool = True, meta_json: bool = False,
                  row_group_size: int = 16) -> str:
    vec_type = pa.list_(pa.float32(), DIM) if fixed else pa.list_(pa.float32())
    cols = {"id": pa.array([r["id"] for r in records]),
            "vector": pa.array([r["vector"] for r in records], type=vec_type),
            "document": pa.array([r.get("document") for r in records], type=pa.string())}
    meta = [r.get("metadata") for r in records]
    cols["metadata"] = pa.array([None if m is None else json.dumps(m) for m in meta], type=pa.string()) \
        if meta_json else pa.array(meta)
    pq.write_table(pa.table(cols), str(path), row_group_size=row_group_size)
    return str(path)


def read_all(path: str, start: int = 0, batch: int = 7) -> dict:
    f = open_records(path)
    got = {"ids": [], "vectors": [], "metadata": [], "documents": [], "firsts": []}
    for rec in f.batches(start, batch):
        got["firsts"].append(rec.first)
        got["ids"] += list(rec.ids.tolist() if isinstance(rec.ids, np.ndarray) else rec.ids)
        got["vectors"].append(rec.vectors)
        got["metadata"] += rec.metadata_rows() if rec.metadata is not None else [None] * len(rec)
        got["documents"] += rec.documents if rec.documents is not None else [None] * len(rec)
    got["vectors"] = np.concatenate(got["vectors"]) if got["vectors"] else np.zeros((0, DIM), np.float32)
    got["rows"] = f.rows
    return got


def expected(records: list[dict], start: int = 0) -> dict:
    part = records[start:]
    return {"ids": [r["id"] for r in part], "vectors": np.array([r["vector"] for r in part], np.float32).reshape(-1, DIM),
            "metadata": [r.get("metadata") for r in part], "documents": [r.get("document") for r in part]}


def same(got: dict, want: dict) -> None:
    assert got["ids"] == want["ids"]
    np.testing.assert_array_equal(got["vectors"], want["vectors"])
    assert got["metadata"] == want["metadata"]
    assert got["documents"] == want["documents"]


# --- readers -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["jsonl", "parquet-fixed", "parquet-list", "parquet-json-metadata"])
@pytest.mark.parametrize("start", [0, 20, N])
def test_reader_round_trip_and_start(tmp_path, kind, start):
    records = rows(str_ids=kind != "parquet-list")
    if kind == "jsonl":
        path = write_jsonl(tmp_path / "r.jsonl", records, blank_every=9)
    else:
        path = write_parquet(tmp_path / "r.parquet", records, fixed=kind != "parquet-list",
                             meta_json=kind == "parquet-json-metadata")
    got = read_all(path, start)
    assert got["rows"] == N
    same(got, expected(records, start))
    if start < N:
        assert got["firsts"][0] == start and all(b > a for a, b in zip(got["firsts"], got["firsts"][1:]))
    types = {type(m["page"]) for m in got["metadata"] if m}
    assert types <= {int}  # ints stay ints, whichever the file


def test_int_ids_are_int64(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", rows(10, str_ids=False))
    [rec] = open_records(path).batches(0, 100)
    assert rec.ids.dtype == np.int64 and rec.ids.tolist() == [r * 3 for r in range(10)]


def test_struct_metadata_leaves_out_null_fields(tmp_path):
    records = [{"id": 1, "vector": [0.0] * DIM, "metadata": {"a": 1}},
               {"id": 2, "vector": [0.0] * DIM, "metadata": {"b": "x"}}]
    [rec] = open_records(write_parquet(tmp_path / "s.parquet", records)).batches(0, 10)
    assert not isinstance(rec.metadata, list)  # no null rows: columns, for Index.upsert's columnar path
    assert rec.metadata_rows() == [{"a": 1}, {"b": "x"}]  # not {"a": 1, "b": None}
    records.append({"id": 3, "vector": [0.0] * DIM})
    [rec] = open_records(write_parquet(tmp_path / "n.parquet", records)).batches(0, 10)
    assert rec.metadata == [{"a": 1}, {"b": "x"}, None]  # a null row: rows


@pytest.mark.parametrize("lines,match", [
    (['{"id": 1, "vector": [1, 2], "documents": "x"}'], r"line 1 \(row 0\): unknown key\(s\) \['documents'\]"),
    (['{"id": 1}'], r"line 1 \(row 0\): no vector"),
    (['{"id": 1, "vector": [1, 2]}', '[1, 2]'], r"line 2 \(row 1\): expected a JSON object"),
    (['{"id": 1, "vector": [1, 2]}', '{"id": 2, "vector": [1, 2, 3]}'],
     r"row 1: vector has 3 values, expected 2 like row 0"),
    (['{"id": 1, "vector": [1, 2]}', '{"id": "b", "vector": [1, 2]}'], r"row 1: id 'b' is str; every id must be"),
    (['{"id": 1, "vector": [1, 2], "metadata": "{bad"}'], r"row 0: metadata is not valid JSON"),
    (['{"id": 1, "vector": [1, 2], "metadata": [1]}'], r"row 0: metadata must be a JSON object or null, got list"),
    (['{"id": 1, "vector": [1, 2], "document": 5}'], r"row 0: document must be a string or null, got int"),
    (['{"id": 1, "vector": ["a", "b"]}'], r"rows 0..0: vectors must hold numbers"),
    (['{"id": 1, "vector": [1, 2]', ], r"line 1 \(row 0\): not valid JSON"),
])
def test_jsonl_errors_name_the_row(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=match):
        list(open_records(str(path)).batches(0, 10))


def test_parquet_errors(tmp_path):
    path = str(tmp_path / "extra.parquet")
    pq.write_table(pa.table({"id": [1], "vector": [[1.0]], "text": ["x"]}), path)
    with pytest.raises(RecordError, match=r"unknown column\(s\) \['text'\]; expected id, vector, metadata, document"):
        open_records(path)
    pq.write_table(pa.table({"id": [1]}), path)
    with pytest.raises(RecordError, match=r"no column\(s\) \['vector'\]"):
        open_records(path)
    pq.write_table(pa.table({"id": pa.array([1, None]), "vector": [[1.0], [2.0]]}), path)
    with pytest.raises(RecordError, match=r"row 1: id is null"):
        list(open_records(path).batches(0, 10))
    pq.write_table(pa.table({"id": [1], "vector": [[1.0]], "metadata": [3]}), path)
    with pytest.raises(RecordError, match=r"column metadata: expected a struct or a string of JSON, got int64"):
        list(open_records(path).batches(0, 10))
    with pytest.raises(ValueError, match=r"expected a .parquet, .jsonl or .ndjson record file"):
        open_records(str(tmp_path / "x.csv"))


# --- vindex ingest against a server (the in-process server fixtures of test_service_payload) -------
served, client = test_service_payload.served, test_service_payload.client


def ingest(capsys, served, *args: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = cli.main(["ingest", *args, "--quiet", "--server", served.target])
    return rc, capsys.readouterr().err


def stored(col, records: list[dict]) -> None:
    """The collection holds exactly ``records``."""
    ids = [r["id"] for r in records]
    got = col.get(ids, include=["metadata", "documents"])
    x, found = got
    assert found.all() and len(col) == len(records)
    np.testing.assert_array_equal(x, np.array([r["vector"] for r in records], np.float32))
    assert got.metadata == [r.get("metadata") for r in records]
    assert got.documents == [r.get("document") for r in records]


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
def test_ingest_records_and_resume_after_a_stop(tmp_path, capsys, served, client, monkeypatch, kind):
    records = rows(str_ids=kind == "jsonl", seed=4)
    path = (write_parquet(tmp_path / "r.parquet", records) if kind == "parquet"
            else write_jsonl(tmp_path / "r.jsonl", records, blank_every=10))
    name = f"ing-{kind}"
    stream = Collection.upsert_stream
    sent: list[int] = []

    def stopped_after_two(self, batches):  # Ctrl-C once two chunks are acknowledged
        for n, ack in enumerate(stream(self, batches)):
            yield ack
            if n == 1:
                raise KeyboardInterrupt

    def counted(self, batches):
        return stream(self, (sent.append(len(b[0])) or b for b in batches))

    monkeypatch.setattr(Collection, "upsert_stream", stopped_after_two)
    rc, _ = ingest(capsys, served, path, "--collection", name, "--batch", "8")
    assert rc == 130
    assert json.load(open(progress_path(path, name)))["rows_done"] == 16
    col = client.collection(name)
    assert col.id_type == ("str" if kind == "jsonl" else "int") and len(col) >= 16  # chunks in flight may land

    monkeypatch.setattr(Collection, "upsert_stream", counted)
    rc, err = ingest(capsys, served, name, path, "--batch", "8")  # the NAME FILE form
    assert rc == 0 and "resuming at row 16 of 50" in err and "ingested rows 16..50" in err, err
    assert sum(sent) == N - 16  # the acknowledged rows were not sent again
    stored(col, records)
    rc, err = ingest(capsys, served, path, "--collection", name)
    assert rc == 0 and "nothing to ingest" in err


def test_ingest_limit_and_bad_files(tmp_path, capsys, served, client):
    records = rows(seed=5)
    path = write_jsonl(tmp_path / "lim.jsonl", records)
    rc, err = ingest(capsys, served, path, "--collection", "ing-limit", "--limit", "20", "--batch", "6")
    assert rc == 0 and "ingested rows 0..20" in err
    stored(client.collection("ing-limit"), records[:20])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "vector": [1, 2]}\n{"id": "b", "vector": [1]}\n')
    rc, err = ingest(capsys, served, str(bad), "--collection", "ing-bad")
    assert rc == 2 and "row 1: vector has 1 values, expected 2 like row 0" in err
    with pytest.raises(SystemExit, match="--id-offset and --key are for vector files"):
        ingest(capsys, served, path, "--collection", "ing-x", "--id-offset", "5")
    with pytest.raises(SystemExit, match="NAME FILE, or FILE --collection NAME"):
        ingest(capsys, served, path)


def test_ingest_of_struct_metadata_goes_as_columns(tmp_path, capsys, served, client, monkeypatch):
    """Parquet struct metadata without null rows travels as Arrow columns (``metadata_arrow``)
    into Index.upsert's columnar path, and is stored as the same rows would be; a bad value
    is named by its row in the chunk."""
    records = [{**r, "metadata": r.get("metadata") or {"page": i}} for i, r in enumerate(rows(seed=6))]
    records[3]["metadata"] = {"page": 3}  # other fields null in this row: left out
    path = write_parquet(tmp_path / "c.parquet", records)
    stream = Collection.upsert_stream
    kinds: list[bool] = []

    def watched(self, batches):
        return stream(self, (kinds.append(not isinstance(b[2], list)) or b for b in batches))

    monkeypatch.setattr(Collection, "upsert_stream", watched)
    rc, err = ingest(capsys, served, path, "--collection", "ing-cols", "--batch", "16")
    assert rc == 0 and kinds and all(kinds), err
    stored(client.collection("ing-cols"), records)
    bad = [{"id": i, "vector": [0.0] * DIM, "metadata": {"x": float(i) if i != 5 else float("inf")}} for i in range(8)]
    rc, err = ingest(capsys, served, write_parquet(tmp_path / "bad.parquet", bad), "--collection", "ing-cols-bad")
    assert rc == 2 and "metadata[5]" in err and "not a finite number" in err, err
