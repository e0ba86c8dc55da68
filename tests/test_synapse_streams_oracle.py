"""factstream's list of Synapse's id-generated streams against Synapse's own storage code.

A script under the oracle's Python walks every module of
``synapse/storage/databases`` and reads the arguments of each multi-writer id
generator Synapse builds (stream name, tables, sequence, writers, direction).
The test fails when Synapse has a stream factstream's list lacks, or one whose
tables or sequence changed: ``factstream synapse check`` would otherwise miss it.
"""

from __future__ import annotations

import json
import subprocess

from factstream.synapse.streams import SYNAPSE_ID_STREAMS

from conftest import synapse_python

EXTRACT = r"""
import ast, json, os
import synapse
import synapse.replication.tcp.streams as wire_streams

root = os.path.join(os.path.dirname(synapse.__file__), "storage", "databases")

def value(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        pass
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):  # e.g. QuarantinedMediaStream.NAME
        return getattr(getattr(wire_streams, node.value.id), node.attr)
    raise ValueError("cannot evaluate " + ast.unparse(node))

found = []
for folder, _, files in os.walk(root):
    for name in sorted(files):
        if not name.endswith(".py"):
            continue
        path = os.path.join(folder, name)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            callee = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if callee not in ("MultiWriterIdGenerator", "StreamIdGenerator"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            writers = kw.get("writers")
            text = ast.unparse(writers) if writers is not None else "[]"
            prefix = "hs.config.worker.writers."
            found.append({
                "where": os.path.relpath(path, root),
                "name": value(kw["stream_name"]),
                "sequence": value(kw["sequence_name"]),
                "tables": [list(t) for t in value(kw["tables"])],
                "writers_setting": text[len(prefix):] if text.startswith(prefix) else None,
                "fixed_writers": [] if text.startswith(prefix) else list(value(writers) if writers is not None else []),
                "positive": value(kw["positive"]) if "positive" in kw else True,
            })
print(json.dumps({"generators": found, "wire": sorted(wire_streams.STREAMS_MAP)}))
"""


def _oracle() -> dict[str, object]:
    proc = subprocess.run([synapse_python(), "-c", EXTRACT], capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, object] = json.loads(proc.stdout)
    return result


def _ours() -> dict[str, dict[str, object]]:
    return {
        s.name: {
            "sequence": s.sequence,
            "tables": [[t.table, t.instance_column, t.id_column] for t in s.tables],
            "writers_setting": s.writers_setting,
            "fixed_writers": list(s.fixed_writers),
            "positive": s.positive,
        }
        for s in SYNAPSE_ID_STREAMS
    }


def test_every_synapse_id_stream_is_known_with_its_tables_and_sequence() -> None:
    oracle = _oracle()
    generators = oracle["generators"]
    assert isinstance(generators, list) and len(generators) >= 15  # the walk really found Synapse's generators
    ours = _ours()
    theirs = {g["name"]: {k: v for k, v in g.items() if k not in ("name", "where")} for g in generators}
    missing = sorted(set(theirs) - set(ours))
    assert not missing, f"Synapse streams missing from factstream.synapse.streams: {missing} ({[g['where'] for g in generators if g['name'] in missing]})"
    for name, spec in theirs.items():
        assert ours[name] == spec, f"stream {name!r} differs from Synapse's definition"
    assert not set(ours) - set(theirs), "factstream lists streams Synapse no longer has"


def test_wire_names_are_synapse_replication_streams() -> None:
    wire = set(_oracle()["wire"])  # type: ignore[arg-type]
    for s in SYNAPSE_ID_STREAMS:
        assert s.wire is None or s.wire in wire, s
