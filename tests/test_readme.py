"""The README's Python examples run as written; the client example against a real server
started the way ``make run`` starts it (on a free port instead of 50051)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DEFAULT_ADDRESS = "127.0.0.1:50051"


def _blocks() -> list[str]:
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


@pytest.fixture(scope="module")
def wiki_server(tmp_path_factory):
    data = tmp_path_factory.mktemp("readme") / "vindex-data"
    proc = subprocess.Popen([sys.executable, "-m", "vindex.service.cli", "serve", "--data", str(data), "--port", "0",
                             "--sample", "wiki", "--log-level", "warning"], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r" on (\S+:\d+) ", line)
        assert m, f"server did not start: {line!r}"
        yield m.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


def test_readme_library_blocks_run():
    blocks = [b for b in _blocks() if "vindex.Client(" not in b]
    assert blocks, "README has a Python quick start"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})


def test_readme_client_blocks_run(wiki_server):
    blocks = [b for b in _blocks() if "vindex.Client(" in b]
    assert blocks, "README shows the client"
    for code in blocks:
        assert DEFAULT_ADDRESS in code
        exec(compile(code.replace(DEFAULT_ADDRESS, wiki_server), "README.md", "exec"), {"__name__": "__readme__"})
