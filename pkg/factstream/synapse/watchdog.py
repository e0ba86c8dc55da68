"""The watchdog's judgement: what the wire says per (stream, writer), compared with the database.

Pure bookkeeping, no I/O: :class:`Watchdog` is fed every replication command
(:meth:`Watchdog.on_command`) and, when a database is given, what the
database holds above the wire's tokens (:meth:`Watchdog.on_database`), and
:meth:`Watchdog.report` says at any moment how each (stream, writer) stands.

It follows tokens the way a Synapse reader does: an ``RDATA`` at token *t*, or
a ``POSITION prev new`` with ``prev <= token <= new``, is *trusted*: a reader
takes every id up to it as seen and never fetches them. A ``POSITION`` whose
``prev`` lies above the reader's token makes a reader fetch the missed range
from the writer (catch-up), so rows there are still reachable. Three
problems follow:

* ``frozen``: the database holds rows of a writer above its token on the
  wire, and has for longer than ``frozen_after`` seconds: nothing reaches the
  wire for them (element-hq/synapse#20080's shape);
* ``writer_behind``: a writer's token stays put while another writer of the
  same stream moves on; every reader's token of that stream is held back
  (Synapse's idle writers normally echo the others' progress at once);
* ``unpublished``: a row committed with an id that the wire already covered
  with a trusted token but never sent as ``RDATA`` (element-hq/synapse#19795's
  shape): readers will never fetch it;
* ``sequence_behind_wire``: the stream's PostgreSQL sequence has handed out
  less than a token a writer already announced (set back by hand or by a
  restore): the writer's next rows get ids every reader has passed, so they
  are committed and never seen;
* ``position_ahead``: ``stream_positions`` records a writer beyond anything
  the sequence handed out: no writer wrote that, and Synapse refuses to start
  until it is repaired (not ``frozen``: no rows wait for the wire).

Given the writers the config names for each stream
(:meth:`Watchdog.config_problems`), two more: ``writer_missing``, a
configured writer that never answered on the channel (a dead worker says
nothing, so without the config its absence went unnoticed), and
``writer_unconfigured``, a writer heard on a stream the config does not give it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..commands import Command, PositionCommand, RdataCommand
from .config import MAIN_INSTANCE, MAYBE_QUIET_STREAMS, WIRE_WRITER_SETTINGS

__all__ = ["Watchdog", "WriterWatch", "Problem", "DbView", "AUDITED_STREAMS", "NO_ECHO_STREAMS", "WRITER_PROBLEMS"]

#: Wire streams whose every table row is sent as one RDATA at the row's own id,
#: so an id covered by the wire but absent from every RDATA is a row readers never got.
AUDITED_STREAMS = frozenset({"receipts", "account_data", "push_rules", "thread_subscriptions"})

#: Streams whose idle writers do not echo other writers' progress (Synapse skips it for caches).
NO_ECHO_STREAMS = frozenset({"caches", "typing", "federation", "presence_federation"})

#: The problems judged against the config's writers (``--config``).
WRITER_PROBLEMS = ("writer_missing", "writer_unconfigured")

_RATE_WINDOW = 10.0
_MAX_PUBLISHED = 200_000


@dataclass
class DbView:
    """What the database holds for one (stream, writer) at one moment.

    ``top``: the highest row id of the writer above the probe's bound (None if
    none); ``position``: its ``stream_positions`` value; ``ids``: ids of its
    rows within the audited range (audited streams only); ``sequence_issued``:
    the highest id the stream's sequence had handed out, read after
    ``wire_token`` (the writer's token the probe was given) was taken.
    """

    top: int | None = None
    position: int | None = None
    ids: tuple[int, ...] = ()
    sequence: str | None = None
    sequence_issued: int | None = None
    wire_token: int | None = None


@dataclass
class WriterWatch:
    """One (stream, writer) as seen on the wire."""

    stream: str
    writer: str
    baseline: int | None = None
    token: int | None = None
    last_advance: float | None = None
    rows_total: int = 0
    positions_total: int = 0
    recent_rows: deque[tuple[float, int]] = field(default_factory=deque)
    catch_up: list[tuple[int, int]] = field(default_factory=list)
    db_top: int | None = None
    db_position: int | None = None
    pending_since: float | None = None
    unpublished: set[int] = field(default_factory=set)
    sequence: str | None = None
    sequence_behind: tuple[int, int] | None = None
    position_ahead: tuple[int, int] | None = None

    def rate(self, now: float) -> float:
        """RDATA rows per second over the last ten seconds."""
        while self.recent_rows and self.recent_rows[0][0] < now - _RATE_WINDOW:
            self.recent_rows.popleft()
        return sum(n for _, n in self.recent_rows) / _RATE_WINDOW

    def in_catch_up(self, sid: int) -> bool:
        """Whether a reader would have fetched ``sid`` through catch-up."""
        return any(lo < sid <= hi for lo, hi in self.catch_up)


@dataclass(frozen=True)
class Problem:
    """Something an operator should look at, in plain words."""

    kind: str
    stream: str
    writer: str
    summary: str
    ids: tuple[int, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"kind": self.kind, "stream": self.stream, "writer": self.writer, "summary": self.summary,
                "ids": list(self.ids)}


class Watchdog:
    """Per-(stream, writer) state of a deployment's replication, and its problems."""

    def __init__(self, *, frozen_after: float = 30.0, clock: Any = time.monotonic) -> None:
        self.frozen_after = frozen_after
        self._clock = clock
        self.writers: dict[tuple[str, str], WriterWatch] = {}
        self._published: dict[str, set[int]] = {}
        self.commands_seen = 0

    def _writer(self, stream: str, writer: str) -> WriterWatch:
        key = (stream, writer)
        w = self.writers.get(key)
        if w is None:
            w = self.writers[key] = WriterWatch(stream, writer)
        return w

    def _advance(self, w: WriterWatch, token: int, now: float) -> None:
        if w.token is None:
            w.baseline = token
            w.token = token
            w.last_advance = now
        elif token > w.token:
            w.token = token
            w.last_advance = now

    def on_command(self, cmd: Command, now: float | None = None) -> None:
        """Take one replication command into account."""
        now = self._clock() if now is None else now
        self.commands_seen += 1
        if isinstance(cmd, RdataCommand):
            w = self._writer(cmd.stream_name, cmd.instance_name)
            w.rows_total += 1
            w.recent_rows.append((now, 1))
            if cmd.token is None:
                return  # a batch row: its id is the token of the batch's last row
            if cmd.stream_name in AUDITED_STREAMS:
                published = self._published.setdefault(cmd.stream_name, set())
                if len(published) < _MAX_PUBLISHED:
                    published.add(cmd.token)
            if w.token is None:
                w.baseline = cmd.token - 1  # this row itself is published; what came before is not ours to judge
                w.token = cmd.token - 1
            self._advance(w, cmd.token, now)
        elif isinstance(cmd, PositionCommand):
            w = self._writer(cmd.stream_name, cmd.instance_name)
            w.positions_total += 1
            if w.token is not None and cmd.prev_token > w.token and cmd.new_token > w.token:
                w.catch_up.append((w.token, cmd.new_token))  # a reader fetches (token, new] from the writer
                del w.catch_up[:-1000]
            self._advance(w, cmd.new_token, now)

    def on_database(self, views: Mapping[tuple[str, str], DbView], now: float | None = None) -> None:
        """Take the database's view of each (stream, writer) into account."""
        now = self._clock() if now is None else now
        for (stream, writer), view in views.items():
            w = self._writer(stream, writer)
            w.db_top = view.top
            w.db_position = view.position
            w.sequence = view.sequence
            issued = view.sequence_issued
            # Synapse's id generators take 1 as seen before any id is issued: a token of 1 needs no sequence value.
            w.sequence_behind = (issued, view.wire_token) if (
                issued is not None and view.wire_token is not None and view.wire_token > max(issued, 1)) else None
            w.position_ahead = (view.position, issued) if (
                issued is not None and view.position is not None and view.position > max(issued, 1)) else None
            # Rows above the wire's token, or (for a writer the wire knows) a recorded position above it that
            # some writer really reached (a position beyond the sequence is position_ahead, not rows in waiting).
            ahead = (view.top is not None and (w.token is None or view.top > w.token)) or (
                w.token is not None and view.position is not None and view.position > w.token
                and w.position_ahead is None)
            if ahead:
                if w.pending_since is None:
                    w.pending_since = now
            else:
                w.pending_since = None
            if stream in AUDITED_STREAMS and w.token is not None and w.baseline is not None:
                published = self._published.get(stream, set())
                for sid in view.ids:
                    if w.baseline < sid <= w.token and sid not in published and not w.in_catch_up(sid):
                        w.unpublished.add(sid)
        for (stream, writer), w in self.writers.items():
            if (stream, writer) not in views and w.db_top is not None:
                w.db_top = None
                w.pending_since = None
            if (stream, writer) not in views:
                w.sequence_behind = w.position_ahead = None

    def audit_ranges(self, streams: Iterable[str]) -> dict[tuple[str, str], tuple[int, int]]:
        """(stream, writer) -> the id range (baseline, token] the database probe should list rows of."""
        wanted = set(streams)
        return {(s, wr): (w.baseline, w.token) for (s, wr), w in self.writers.items()
                if s in wanted and w.baseline is not None and w.token is not None and w.token > w.baseline}

    def heard(self) -> set[tuple[str, str]]:
        """The (stream, writer)s the wire spoke for (not those only the database knows)."""
        return {k for k, w in self.writers.items() if w.rows_total or w.positions_total}

    def tokens(self) -> dict[tuple[str, str], int]:
        """The current wire token of every (stream, writer)."""
        return {k: w.token for k, w in self.writers.items() if w.token is not None}

    def problems(self, now: float | None = None, *, wire_seen: bool = True) -> list[Problem]:
        """Every problem standing now.

        ``wire_seen`` False (the watch is cut off from Redis): the problems
        judged from the wire's silence (``frozen``, ``writer_behind``) are left
        out, since the watch cannot tell them from its own deafness.
        """
        now = self._clock() if now is None else now
        out: list[Problem] = []
        by_stream: dict[str, list[WriterWatch]] = {}
        for w in self.writers.values():
            by_stream.setdefault(w.stream, []).append(w)
        for (stream, writer), w in sorted(self.writers.items()):
            out.extend(_sequence_problems(w))
            if wire_seen and w.pending_since is not None and now - w.pending_since >= self.frozen_after:
                token = "nothing" if w.token is None else str(w.token)
                if w.db_top is not None:
                    held = f"holds rows of {writer} up to id {w.db_top}"
                else:
                    held = f"records {writer} at position {w.db_position}"
                out.append(Problem(
                    "frozen", stream, writer,
                    f"the database {held} but the wire has announced {token} "
                    f"for {now - w.pending_since:.0f}s: nothing reaches the readers"))
            if wire_seen and stream not in NO_ECHO_STREAMS and w.token is not None and w.last_advance is not None:
                others = [o for o in by_stream[stream] if o is not w and o.token is not None and o.last_advance is not None]
                ahead = [o for o in others if o.token is not None and w.token is not None and o.token > w.token
                         and o.last_advance is not None and w.last_advance is not None
                         and o.last_advance - w.last_advance >= self.frozen_after]
                if ahead:
                    lead = max(ahead, key=lambda o: o.token or 0)
                    out.append(Problem(
                        "writer_behind", stream, writer,
                        f"{writer} has stayed at {w.token} for {now - w.last_advance:.0f}s while {lead.writer} moved "
                        f"on to {lead.token}: every reader's {stream} token is held back (is {writer} stopped or cut "
                        "off from Redis?)"))
            if w.unpublished:
                ids = tuple(sorted(w.unpublished))
                shown = ", ".join(str(i) for i in ids[:20]) + (" ..." if len(ids) > 20 else "")
                out.append(Problem(
                    "unpublished", stream, writer,
                    f"{len(ids)} committed row(s) of {writer} with id(s) {shown} were covered by the wire "
                    "without an RDATA: readers will never fetch them", ids))
        return out

    def config_problems(self, configured: Mapping[str, tuple[str, ...]], *, judge_missing: bool,
                        listened: float, source: str = "the config") -> list[Problem]:
        """Writers the config names that the wire has not heard, and writers it heard that the config does not name.

        ``configured``: replication stream -> its writers (streams left out are
        not judged). ``judge_missing`` only once every live writer had the time
        to answer the REPLICATE (and never when nothing at all was heard: that
        is the ``silent`` problem, a wrong channel rather than dead writers).
        """
        out: list[Problem] = []
        heard = self.heard()
        speakers = {writer for _, writer in heard}
        spoken = {stream for stream, _ in heard}
        for stream, writers in sorted(configured.items()):
            where = _where(stream, source)
            for writer in writers:
                if not judge_missing or not heard or stream in MAYBE_QUIET_STREAMS or (stream, writer) in heard:
                    continue
                if writer not in speakers:
                    fix = (f"start it (its log says why it stopped), or if it was retired, remove it from {where} "
                           "and restart every process") if writer != MAIN_INSTANCE else \
                        "start the main process (its log says why it stopped)"
                    out.append(Problem(
                        "writer_missing", stream, writer,
                        f"{writer} writes {stream} ({where}) but has said nothing on the channel in "
                        f"{listened:.0f}s, although a live Synapse writer answers the REPLICATE sent on subscribing "
                        f"at once: {writer} is not running, hung, or connected to another Redis or server_name; "
                        f"{fix}"))
                elif stream in spoken:
                    out.append(Problem(
                        "writer_missing", stream, writer,
                        f"{writer} answers on the channel but not for {stream}, which {where} gives it: the config "
                        f"{writer} runs with does not make it a {stream} writer (this config not deployed there, or "
                        f"{writer} not restarted since): deploy it and restart {writer}"))
                # else: nobody announces the stream: a Synapse older than the stream, nothing to judge.
        for (stream, writer) in sorted(heard):
            named = configured.get(stream)
            if named is None or writer in named:
                continue
            out.append(Problem(
                "writer_unconfigured", stream, writer,
                f"{writer} announces {stream} on the channel but {_where(stream, source)} names only "
                f"{', '.join(named) or 'no writer'}: a stale worker still running with an old config, or {source} "
                f"is not the config deployed; stop {writer} if it was retired, or deploy this config to every "
                "process and restart them"))
        return out

    def snapshot(self, now: float | None = None) -> list[dict[str, Any]]:
        """Every (stream, writer) as a JSON-ready dict, sorted."""
        now = self._clock() if now is None else now
        out = []
        for (stream, writer), w in sorted(self.writers.items()):
            lag = None
            if w.token is not None:
                # A position beyond the sequence (position_ahead) is no id any writer reached: not lag.
                position = w.db_position if w.position_ahead is None else None
                lag = max((w.db_top or 0) - w.token, (position or 0) - w.token, 0)
            out.append({
                "stream": stream, "writer": writer, "token": w.token,
                "rows_per_second": round(w.rate(now), 3), "rows_total": w.rows_total,
                "seconds_since_advance": None if w.last_advance is None else round(now - w.last_advance, 1),
                "db_top": w.db_top, "db_position": w.db_position, "db_lag": lag,
                "unpublished": len(w.unpublished),
            })
        return out


#: The problems of a writer's figures against its stream's sequence: (kind, the WriterWatch field holding the
#: pair of figures, their names, the summary). A figure is the sequence's ``issued`` and the writer's wire token
#: (``announced``) or its ``stream_positions`` row (``position``); ``seq`` is the sequence's name.
_SEQUENCE_PROBLEMS: tuple[tuple[str, str, tuple[str, str], str], ...] = (
    ("sequence_behind_wire", "sequence_behind", ("issued", "announced"),
     "sequence {seq} has handed out only up to {issued} but {writer} already announced {stream} token {announced}: "
     "new rows get ids every reader has passed and are never seen (the sequence was set back: a restore or a hand "
     "edit); stop every Synapse process and run 'factstream synapse check --fix' (or setval {seq} to at least "
     "{announced})"),
    ("position_ahead", "position_ahead", ("position", "issued"),
     "stream_positions records {writer} at {position} but sequence {seq} has handed out only up to {issued} (edited "
     "by hand, or the sequence and stream_positions restored from different backups); Synapse refuses to start "
     "until it is repaired: run 'factstream synapse check' for the repair"),
)


def _sequence_problems(w: WriterWatch) -> list[Problem]:
    """``sequence_behind_wire`` and ``position_ahead`` of one writer, as they stand."""
    out: list[Problem] = []
    # A position the wire also reached only says again that the sequence went back: one problem is enough.
    restated = (w.sequence_behind is not None and w.position_ahead is not None
                and w.position_ahead[0] <= w.sequence_behind[1])
    for kind, attr, names, summary in _SEQUENCE_PROBLEMS:
        figures = getattr(w, attr)
        if figures is None or (kind == "position_ahead" and restated):
            continue
        out.append(Problem(kind, w.stream, w.writer, summary.format(
            seq=w.sequence or "its sequence", writer=w.writer, stream=w.stream, **dict(zip(names, figures)))))
    return out


def _where(stream: str, source: str) -> str:
    """Where the config names the writers of ``stream``."""
    setting = WIRE_WRITER_SETTINGS.get(stream)
    return f"stream_writers.{setting} of {source}" if setting else "Synapse's own rule: the main process"
