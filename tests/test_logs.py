"""Structured, redacted server logs (service/logs.py, ``vindex serve --log-json``)."""
from __future__ import annotations

import hashlib
import io
import json
import logging

import pytest

from vindex.service import logs

KEY = "tenant-key-0123456789"
PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


@pytest.fixture
def captured():
    """A logger whose records go through a configured handler into a string."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    out = io.StringIO()

    def setup(json_lines: bool) -> tuple[io.StringIO, logs.Redactor]:
        return out, logs.configure("info", json_lines, stream=out)
    yield setup
    root.handlers[:], root.level = saved


def test_json_lines_one_event_each_with_fields_and_traceback(captured):
    out, _ = captured(json_lines=True)
    log = logging.getLogger("vindex.test")
    log.info("opened %s", "docs", extra={"collection": "docs", "vectors": 12})
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == "opened docs" and first["level"] == "INFO" and first["logger"] == "vindex.test"
    assert first["collection"] == "docs" and first["vectors"] == 12 and first["ts"].endswith("+00:00")
    assert second["level"] == "ERROR" and "RuntimeError: boom" in second["exc"]


def test_text_lines_keep_a_traceback_on_its_line(captured):
    out, _ = captured(json_lines=False)
    try:
        raise ValueError("x")
    except ValueError:
        logging.getLogger("vindex.test").exception("failed")
    text = out.getvalue()
    assert text.count("\n") == 1 and "failed\\nTraceback" in text


@pytest.mark.parametrize("json_lines", [True, False])
def test_secrets_never_reach_the_output(captured, json_lines):
    out, redactor = captured(json_lines=json_lines)
    logs.add_key_digests([hashlib.sha256(KEY.encode()).digest()])
    log = logging.getLogger("vindex.test")
    log.warning("call with metadata x-api-key: %s refused", "abc-secret-1")
    log.warning("authorization: Bearer abc-secret-2; config {'api_keys': ['abc-secret-3']}")
    log.warning("loaded key file %s", PEM)
    log.warning("a client sent %s in its request", KEY)  # no label says it is a key: its digest does
    log.warning("extra field", extra={"note": f"key={KEY}"})
    try:
        raise PermissionError(f"bad key {KEY!r}")
    except PermissionError:
        log.exception("refused")
    text = out.getvalue()
    for secret in ("abc-secret-1", "abc-secret-2", "abc-secret-3", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", KEY):
        assert secret not in text
    assert text.count(logs.REDACTED) >= 5 and "[redacted private key]" in text
    assert len(text.splitlines()) == 6  # one line per event
    assert "a client sent [redacted] in its request" in text


def test_serve_log_json_writes_json_lines_without_the_keys(tmp_path):
    from test_service import ServerProcess, stopped_cleanly

    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": [{"name": "app", "api_keys": [KEY],
                                                "classes": ["interactive", "update", "admin"]}]}))
    srv = ServerProcess(tmp_path / "data", "--log-json", "--tenants", str(tenants), "--host", "0.0.0.0")
    stopped_cleanly(srv)
    lines = srv.log().splitlines()
    events = [json.loads(line) for line in lines]  # every line is one JSON event
    assert any("loaded 1 tenant(s)" in e["msg"] for e in events)
    assert any(e["level"] == "WARNING" and "plaintext" in e["msg"] for e in events)
    assert KEY not in srv.log()
