"""The built wheel installs one import name, ``vindex``, and serves its bundled sample.

The wheel goes into a fresh virtual environment whose dependencies (numpy, numba, grpcio, ...)
come from this one through a path file, so nothing is downloaded; a path file's directory is
added to ``sys.path`` without reading its own path files, so this environment's editable
install of the source tree is not seen there.
"""
from __future__ import annotations

import ast
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("wheel")
    dist = tmp / "dist"
    # built from a copy of the tracked tree: setuptools reuses a source tree's build/ folder,
    # where modules since moved away would still be found
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                             ".pytest_cache", ".hypothesis", "vindex-data"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], check=True,
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
    return str(env_dir), wheel


def _source_modules() -> set[str]:
    """Every module of the installed package, as its path inside the wheel."""
    folders = {"vindex": "vindex", "native": "vindex/native", "service": "vindex/service", "data": "vindex/data"}
    found = set()
    for folder, installed in folders.items():
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            for name in names:
                if name.endswith(".py"):
                    found.add(os.path.normpath(os.path.join(installed, rel, name)))
    return found


def test_the_wheel_holds_every_module_and_no_other(venv):
    with zipfile.ZipFile(venv[1]) as whl:
        inside = {n for n in whl.namelist() if n.endswith(".py")}
    assert inside == _source_modules()


def test_the_wheel_installs_vindex_alone(venv, tmp_path):
    venv = venv[0]
    script = ("import importlib.util, vindex, vindex.native, vindex.service.server, vindex.data\n"
              "assert vindex.__file__.startswith(%r), vindex.__file__\n"
              "print(sorted(n for n in ('native', 'service', 'bench', 'data') if importlib.util.find_spec(n)))\n"
              % venv)
    res = subprocess.run([os.path.join(venv, "bin", "python"), "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", f"top-level names besides vindex: {res.stdout}"


def test_the_wheel_serves_the_bundled_wiki_sample(venv, tmp_path):
    venv = venv[0]
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


def test_importing_vindex_loads_neither_the_service_nor_numba():
    script = ("import sys, vindex\n"
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'numba', 'native', 'service')\n"
              "             or m.startswith('vindex.service')))\n")
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout


def _module_imports(path: str, module: str, is_package: bool) -> set[str]:
    """The vindex modules ``module`` imports when it loads: module-level imports, not those inside
    functions or under ``if TYPE_CHECKING``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", []) +
                      [s for h in getattr(node, "handlers", []) for s in h.body])
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module
                found.add(target)
                found.update(f"{target}.{a.name}" for a in node.names)

    visit(tree.body)
    return found


def test_the_library_has_no_import_cycles():
    """Module-level imports among vindex's modules form no cycle (the service is left out: it
    sits on top of the library, which never imports it at load)."""
    roots = {"vindex": os.path.join(ROOT, "vindex"), "vindex.native": os.path.join(ROOT, "native")}
    files: dict[str, tuple[str, bool]] = {}
    for prefix, folder in roots.items():
        for dirpath, _, names in os.walk(folder):
            rel = os.path.relpath(dirpath, folder)
            pkg = prefix if rel == "." else prefix + "." + rel.replace(os.sep, ".")
            for name in names:
                if name.endswith(".py"):
                    is_pkg = name == "__init__.py"
                    files[pkg if is_pkg else f"{pkg}.{name[:-3]}"] = (os.path.join(dirpath, name), is_pkg)
    # an import of a package from inside it (``from . import policy``) finds it already loading
    graph = {m: {t for t in _module_imports(p, m, is_pkg) if t in files and not (m + ".").startswith(t + ".")}
             for m, (p, is_pkg) in files.items() if m != "vindex"}
    # importing a module first runs its packages' __init__ (unless the importer is inside them)
    for m in graph:
        graph[m] |= {p for t in list(graph[m]) for i in range(1, t.count("."))
                     if (p := t.rsplit(".", i)[0]) in graph and not (m + ".").startswith(p + ".")}
    assert not any(m.startswith("vindex.service") for m in graph)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def walk(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                walk(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            walk(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
