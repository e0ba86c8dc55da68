"""Run under the Synapse oracle's Python: Synapse's own code on a test database.

    python synapse_db_oracle.py prepare CONFIG   create the schema, then write traffic through Synapse's stores
    python synapse_db_oracle.py startup CONFIG   what a Synapse process does to its database at startup

``startup`` builds the homeserver's data stores exactly as ``synapse.app``
does (schema check, then every id generator's consistency check) and prints
one JSON line: {"ok": true} or {"ok": false, "error": ...}; exit 0 / 1.
CONFIG is a homeserver config (JSON is YAML too).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _homeserver(path: str) -> Any:
    import yaml
    from twisted.internet import reactor

    from synapse.config.homeserver import HomeServerConfig
    from synapse.server import HomeServer
    from synapse.storage import DataStore

    class OracleHomeserver(HomeServer):
        DATASTORE_CLASS = DataStore  # type: ignore[assignment]

    with open(path, encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    config = HomeServerConfig()
    config.parse_config_dict(raw, "", "")
    return OracleHomeserver(config.server.server_name, config=config, reactor=reactor)


async def _traffic(hs: Any) -> dict[str, Any]:
    from synapse.api.presence import UserPresenceState

    store = hs.get_datastores().main
    server = hs.hostname
    users = [f"@user{i}:{server}" for i in range(3)]
    for u in users:
        await store.register_user(u, password_hash=None)
    room = f"!room:{server}"
    for i, u in enumerate(users):
        await store.add_account_data_for_user(u, "m.factstream.test", {"n": i})
        await store.add_account_data_to_room(u, room, "m.factstream.room", {"n": i})
        await store.add_tag_to_room(u, room, "u.work", {"order": i})
        await store.insert_receipt(room, "m.read", u, [f"$event{i}:{server}"], None, {"ts": 1000 + i})
        await store.add_push_rule(u, "factstream.rule", 1, [{"kind": "event_match", "key": "type", "pattern": "m.test"}],
                                  ["notify"])
    await store.update_presence([UserPresenceState.default(u) for u in users])
    return {"users": users}


def main() -> int:
    mode, path = sys.argv[1], sys.argv[2]
    import logging

    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    from twisted.internet import defer, reactor

    from synapse.storage.engines import IncorrectDatabaseSetup

    try:
        hs = _homeserver(path)
        hs.setup()
    except IncorrectDatabaseSetup as err:
        print(json.dumps({"ok": False, "error": str(err).strip()}))
        return 1
    if mode == "startup":
        print(json.dumps({"ok": True}))
        return 0
    result: dict[str, Any] = {}

    def done(outcome: Any) -> None:
        if isinstance(outcome, dict):
            result.update(outcome)
        else:
            result["error"] = repr(outcome)
        reactor.stop()

    reactor.callWhenRunning(lambda: defer.ensureDeferred(_traffic(hs)).addBoth(done))
    reactor.run()
    print(json.dumps({"ok": "error" not in result, **result}))
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main())
