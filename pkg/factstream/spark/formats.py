"""Names of the archive formats (kept free of heavy imports for the CLI's --help)."""

from __future__ import annotations

__all__ = ["FORMATS", "FORMATS_HELP"]

#: Archive formats understood by the parser; "auto" sniffs each file.
FORMATS: tuple[str, ...] = ("auto", "lines", "monitor", "redis-csv", "redis-raw")

FORMATS_HELP = """\
  lines      one protocol line per line, optionally prefixed by an ISO-8601 timestamp
             and/or a direction marker ('>' server to client, '<' client to server):
             2026-11-22T01:02:03.456Z > RDATA events master 54 ["ev",[...]]
  monitor    redis-cli MONITOR output: <unix time> [db addr] "PUBLISH" "<channel>" "<payload>"
  redis-csv  redis-cli --csv SUBSCRIBE/PSUBSCRIBE output: "message","<channel>","<payload>"
  redis-raw  redis-cli SUBSCRIBE piped to a file: message, channel, payload on three lines
  auto       detect the format of each file from its first lines (default)
"""
