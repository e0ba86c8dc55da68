"""BENCHMARKS.md's tables are generated from the JSON results, never typed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RENDER = ROOT / "benchmarks" / "render.py"


def test_benchmarks_md_matches_the_json_results() -> None:
    proc = subprocess.run([sys.executable, str(RENDER), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_result_records_the_implementation() -> None:
    results = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert results, "no benchmark results committed"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from render import _impl_of

    for path in results:
        assert _impl_of(json.loads(path.read_text())) in ("c", "python"), path.name


def test_check_fails_on_a_hand_edited_figure(tmp_path: Path) -> None:
    doc = tmp_path / "BENCHMARKS.md"
    results = tmp_path / "results"
    results.mkdir()
    source = ROOT / "benchmarks" / "results" / "heap.json"
    (results / "heap.json").write_text(source.read_text())
    doc.write_text("# x\n<!-- results: heap -->\n<!-- /results -->\n")
    ok = subprocess.run([sys.executable, str(RENDER), "--doc", str(doc), "--results", str(results)])
    assert ok.returncode == 0
    rendered = doc.read_text()
    assert "heap-shuffled" in rendered
    median = json.loads(source.read_text())["benchmarks"][0]["stats"]["rounds"]
    doc.write_text(rendered.replace(f"| {median} |", f"| {median + 1} |", 1))
    check = subprocess.run([sys.executable, str(RENDER), "--check", "--doc", str(doc), "--results", str(results)])
    assert check.returncode == 1
