"""Runs under a Python that has matrix-synapse installed (test-only oracle).

Reads one JSON request per stdin line and answers each with one JSON line on
stdout: what Synapse's own command classes do with it. Only Synapse's public
command API is used.

Request: {"parse": [line, ...], "encode": [[NAME, [args...]], ...]}
Reply:   {"parse": [{"ok": true, "name": .., "fields": {..}, "line": .. | null, "encode_error": null | ..}
                     | {"ok": false, "error": ..}],
          "encode": [{"ok": true, "line": ..} | {"ok": false, "error": ..}]}
"""

from __future__ import annotations

import json
import sys

from synapse.replication.tcp import commands as c

FIELDS = {
    "RDATA": ("stream_name", "instance_name", "token", "row"),
    "POSITION": ("stream_name", "instance_name", "prev_token", "new_token"),
    "USER_SYNC": ("instance_id", "user_id", "device_id", "is_syncing", "last_sync_ms"),
    "FEDERATION_ACK": ("instance_name", "token"),
    "USER_IP": ("user_id", "access_token", "ip", "user_agent", "device_id", "last_seen"),
    "LOCK_RELEASED": ("instance_name", "lock_name", "lock_key"),
    "REPLICATE": (),
    "CLEAR_USER_SYNC": ("instance_id",),
}
CLASSES = {cls.NAME: cls for cls in c._COMMANDS}


def fields_of(cmd: object) -> dict:
    names = FIELDS.get(cmd.NAME, ("data",))
    return {n: getattr(cmd, n) for n in names}


def parse(line: str) -> dict:
    try:
        cmd = c.parse_command_from_line(line)
    except Exception as err:  # noqa: BLE001 - any failure is an answer
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}
    try:  # parsed, but maybe not encodable again (1e400 decodes to inf, which the encoder refuses)
        again, encode_error = f"{cmd.NAME} {cmd.to_line()}", None
    except Exception as err:  # noqa: BLE001
        again, encode_error = None, f"{type(err).__name__}: {err}"
    return {"ok": True, "name": cmd.NAME, "fields": fields_of(cmd), "line": again, "encode_error": encode_error}


def encode(name: str, args: list) -> dict:
    try:
        cmd = CLASSES[name](*args)
        return {"ok": True, "line": f"{cmd.NAME} {cmd.to_line()}"}
    except Exception as err:  # noqa: BLE001
        return {"ok": False, "error": f"{type(err).__name__}: {err}"}


def main() -> None:
    for raw in sys.stdin:
        req = json.loads(raw)
        out = {
            "parse": [parse(line) for line in req.get("parse", [])],
            "encode": [encode(name, args) for name, args in req.get("encode", [])],
        }
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
