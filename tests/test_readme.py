"""The README's Python examples run as written."""
from __future__ import annotations

import os
import re

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_python_blocks_run():
    with open(README) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert blocks, "README has a Python quick start"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
