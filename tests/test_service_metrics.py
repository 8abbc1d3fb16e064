"""Prometheus metrics of ``vindex serve --metrics-port`` (service/metrics.py)."""
from __future__ import annotations

import subprocess
import sys
import urllib.request

import numpy as np
import pytest

import vindex
from conftest import wait_until
from test_service import InProcessServer
from vindex.service.server import Limits

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def scrape(server: InProcessServer) -> dict[str, list]:
    """Samples by name: ``{name: [(labels, value), ...]}``."""
    port = server.server.metrics_http.server_port
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == w for k, w in labels.items()))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    srv = InProcessServer(tmp_path_factory.mktemp("metrics") / "data", metrics_port=0,
                          limits=Limits(max_k=100))
    assert srv.ready.wait(120), srv.error
    yield srv
    srv.stop()


def test_rpc_counts_latency_errors_and_index_gauges(served):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 8)).astype(np.float32)
    with vindex.Client(served.target, timeout=60) as client:
        col = client.create_collection("m", dim=8, exist_ok=True)
        col.upsert(np.arange(500), x)
        acks = list(col.upsert_stream((np.arange(lo, lo + 100), x[lo:lo + 100]) for lo in range(0, 200, 100)))
        assert acks[-1].total == 200
        for _ in range(3):
            col.search(x[:2], k=5)
        with pytest.raises(vindex.InvalidKError):
            col.search(x[:1], k=1000)  # over --max-k: INVALID_ARGUMENT
        with pytest.raises(vindex.IndexNotFoundError):
            client.collection("no-such").search(x[:1], k=1)
    # an aborted call reaches the client before the server's handler has unwound: wait for it
    wait_until(lambda: (value(scrape(served), "vindex_rpc_total", method="DescribeCollection") == 1
                        and value(scrape(served), "vindex_rpc_total", method="Search") == 4), "the failed calls' counts")
    s = scrape(served)
    assert value(s, "vindex_rpc_total", method="Search", collection="m", tenant="default", code="OK") == 3
    assert value(s, "vindex_rpc_total", method="Search", collection="m", code="INVALID_ARGUMENT") == 1
    assert value(s, "vindex_rpc_total", method="Upsert", collection="m", code="OK") == 1
    assert value(s, "vindex_rpc_total", method="UpsertStream", collection="m", code="OK") == 1
    # a name the server does not have is not a label of its own
    assert value(s, "vindex_rpc_total", collection="no-such") == 0
    assert value(s, "vindex_rpc_total", method="DescribeCollection", collection="(unknown)", code="NOT_FOUND") == 1
    assert value(s, "vindex_rpc_seconds_count", method="Search", collection="m") == 4
    assert value(s, "vindex_rpc_seconds_bucket", method="Search", collection="m", le="+Inf") == 4
    assert value(s, "vindex_live_vectors", collection="m") == 500
    assert value(s, "vindex_searches_total", collection="m") == 3
    assert value(s, "vindex_rows_written_total", collection="m") == 700
    assert value(s, "vindex_rss_bytes", collection="m") > 0
    assert value(s, "vindex_io_queued", collection="m", io_class="interactive") == 0
    assert "vindex_splits_pending" in s and "vindex_postings" in s and "vindex_store_bytes" in s
    assert value(s, "vindex_search_partial_total") == 0


def test_the_flag_without_prometheus_client_is_a_clear_error(tmp_path):
    # a process where the import fails: the CLI names the package and the extra
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from vindex.service import cli\n"
            f"sys.exit(cli.main(['serve', '--data', {str(tmp_path)!r}, '--port', '0', '--metrics-port', '0']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "prometheus-client" in out.stderr and "vindex[metrics]" in out.stderr
