"""README.md's Python code runs as written: each ```python block in a fresh interpreter (the installed
package), top-level ``await`` allowed, in an empty directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest

from cli_run import ENV

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# Names a block uses without defining, because the prose around it does: given here, nothing else.
CONTEXT = {
    "data": b'RDATA caches master 7 ["get_user_by_id",["@a:hs"],1]\nPOSITION caches master 6 7\n',
}

RUNNER = r"""
import ast, asyncio, sys
source = sys.stdin.read()
namespace = {"__name__": "__readme__", **CONTEXT}
code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
result = eval(code, namespace)
if asyncio.iscoroutine(result):
    asyncio.run(result)
print("README BLOCK OK")
"""


def blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return BLOCK.findall(fh.read())


README_BLOCKS = blocks(os.path.join(ROOT, "README.md"))


def test_the_readme_has_python_blocks() -> None:
    assert len(README_BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(README_BLOCKS)))
def test_readme_python_block_runs(index: int, tmp_path: Any) -> None:
    source = README_BLOCKS[index]
    out = subprocess.run(
        [sys.executable, "-c", f"CONTEXT = {CONTEXT!r}\n{RUNNER}"], input=source, capture_output=True, text=True,
        timeout=120, env=ENV, cwd=tmp_path,
    )
    assert out.returncode == 0 and "README BLOCK OK" in out.stdout, f"block {index}:\n{source}\n{out.stderr[-3000:]}"
    if "cache_invalidations" in source:
        # The fact's journey ends with the reader printing the fact, keys decoded as a list.
        assert re.search(r"caches master \d+ \[CachesRow\(cache_func='get_user_by_id', keys=\['@alice:hs.example'\]",
                         out.stdout), out.stdout
