"""The built wheel installs one import name, ``vindex``, and serves its bundled sample.

The wheel goes into a fresh virtual environment whose dependencies (numpy, numba, grpcio, ...)
come from this one through a path file, so nothing is downloaded; a path file's directory is
added to ``sys.path`` without reading its own path files, so this environment's editable
install of the source tree is not seen there.
"""
from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), ROOT], check=True,
                   timeout=600)
    (wheel,) = glob.glob(str(dist / "vindex-*.whl"))
    env_dir = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    python = str(env_dir / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(purelib, "deps.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "-q", wheel],
                   check=True, timeout=300)
    return str(env_dir)


def test_the_wheel_installs_vindex_alone(venv, tmp_path):
    script = ("import importlib.util, vindex, vindex.native, vindex.service.server, vindex.data\n"
              "assert vindex.__file__.startswith(%r), vindex.__file__\n"
              "print(sorted(n for n in ('native', 'service', 'bench', 'data') if importlib.util.find_spec(n)))\n"
              % venv)
    res = subprocess.run([os.path.join(venv, "bin", "python"), "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"top-level names besides vindex: {res.stdout}"


def test_the_wheel_serves_the_bundled_wiki_sample(venv, tmp_path):
    proc = subprocess.Popen([os.path.join(venv, "bin", "vindex"), "serve", "--data", str(tmp_path / "data"),
                             "--port", "0", "--sample", "wiki", "--log-level", "warning"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r" on (\S+:\d+) ", line)
        assert m, f"server did not start: {line!r}"
        import vindex

        with vindex.Client(m.group(1)) as client:
            wiki = client.collection("wiki")
            assert len(wiki) == 15_422
            vectors, found = wiki.get([42])
            assert found.all()
            res = wiki.search(vectors, k=5)
            assert res.ids[0, 0] == 42 and np.isclose(res.distances[0, 0], 0, atol=1e-4)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
