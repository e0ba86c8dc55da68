"""Stream id generators on SQLite and PostgreSQL.

A generator hands out stream ids to the local writer, tracks completion with
a :class:`~factstream.ids.tracker.PositionTracker`, records the local position
in ``stream_positions``, and recovers positions from the database at startup.

* PostgreSQL: one sequence per stream (``nextval``; ``generate_series`` for n
  ids at once), any number of writer processes.
* SQLite (the embedded default): ids from an in-process counter seeded from
  the tables, so exactly one writer per stream, in one process.

Backwards streams (``backwards=True``, e.g. backfilled events) hand out
negative ids counting down: -2, -3, ... Their *positions and tokens* are the
positive magnitudes and only grow, exactly like a forwards stream: after ids
-2 and -3 completed, ``current_token()`` is 3. (Synapse's backfill stream
replicates ``-stream_ordering`` the same way.) Everything that takes or gives a
position (``advance``, ``wait_for``, listeners, ``stream_positions``) uses
this positive form; the facts a position range (old, new] covers are the rows
whose id column lies in [-new, -old).

A position of 1 means "empty": the first real id is 2 (or -2).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import weakref
import zlib
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .._checks import seconds, text, whole
from ..backoff import Outage
from ..redaction import redact_text
from ..store.database import Database, DatabaseUnavailable, Transaction, shown_url
from ..store.migrations import migrate
from .errors import IdGeneratorError, PositionWaitTimeout, SequenceBehindError
from .tracker import Listener, PositionTracker, check_names

__all__ = ["IdGenerator", "create_id_generator", "TableSpec"]

logger = logging.getLogger(__name__)

#: (table, instance column or None, id column)
TableSpec = tuple[str, "str | None", str]

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: SQLite counters: ids made durable (``stream_id_blocks``) per write, ahead of use.
SQLITE_ID_BLOCK = 1000

#: Ids and positions are signed 64-bit (BIGINT columns, PostgreSQL sequences).
MAX_ID = 2**63 - 1

#: Most ids one ``get_next_mult`` may reserve: more is a bug (or a ``generate_series`` of billions of rows).
MAX_IDS_PER_CALL = 1_000_000

#: (database file, stream) -> live SQLite writer generator: one counter per stream.
_SQLITE_WRITERS: weakref.WeakValueDictionary[tuple[str, str], IdGenerator] = weakref.WeakValueDictionary()


def _ident(name: str, what: str) -> str:
    if not isinstance(name, str) or not _IDENT.match(name):
        raise IdGeneratorError(f"{what} {name!r} is not a plain SQL identifier (letters, digits, _)")
    return name


def _sqlite_key(db: Database, stream_name: str) -> tuple[str, str]:
    path = getattr(db, "path", ":memory:")
    # every :memory: connection is its own database
    where = f":memory:{id(db)}" if path == ":memory:" else os.path.realpath(path)
    return (where, stream_name)


def default_sequence_name(stream_name: str) -> str:
    """``<stream>_stream_seq`` with anything but letters, digits and _ replaced by _."""
    return re.sub(r"[^A-Za-z0-9_]", "_", stream_name).lower() + "_stream_seq"


class IdGenerator:
    """Stream ids and positions of one stream, for one process.

    Create with :func:`create_id_generator`. ``get_next()`` and
    ``get_next_mult(n)`` are async context managers whose exit completes the
    ids whether the body succeeded or raised; ``get_next_txn(txn)`` reserves
    inside the caller's transaction and completes after commit or rollback.
    """

    def __init__(
        self,
        db: Database,
        tracker: PositionTracker,
        *,
        backwards: bool,
        sequence_name: str | None,
        counter: int | None,
    ) -> None:
        if not isinstance(backwards, bool):
            raise TypeError(f"backwards must be True or False, got {type(backwards).__name__} {backwards!r}")
        self._db = db
        self._tracker = tracker
        self.backwards = backwards
        self._sign = -1 if backwards else 1
        self.sequence_name = sequence_name
        self._counter = counter  # SQLite: last id handed out (token orientation)
        self._block_end = counter  # SQLite: ids up to here are recorded in stream_id_blocks
        self._block_writes: set[asyncio.Task[None]] = set()
        self._ahead = False  # a write of the next block is on its way (see _extend_ahead)
        self._waiters: dict[str | None, list[tuple[int, asyncio.Future[None]]]] = {}
        self._flush_task: asyncio.Task[None] | None = None
        self._flushed = tracker.current_token_for_writer(tracker.instance_name) if tracker.is_writer else 0
        self._closed = False
        #: seconds between background writes of the local position
        self.flush_interval = 0.01
        self._flush_sleeping = False
        self._outage = Outage(
            logger, f"stream {tracker.stream_name}: recording the position in stream_positions", maximum=5.0
        )
        tracker.on_change = self._on_change
        if tracker.is_writer:
            tracker.add_listener(self._on_local_advance)

    # -- identity

    @property
    def stream_name(self) -> str:
        """The stream's name."""
        return self._tracker.stream_name

    @property
    def instance_name(self) -> str:
        """This process's instance name."""
        return self._tracker.instance_name

    @property
    def writers(self) -> tuple[str, ...]:
        """The configured writer instances."""
        return self._tracker.writers

    @property
    def is_writer(self) -> bool:
        """Whether this process may reserve ids."""
        return self._tracker.is_writer

    @property
    def database(self) -> Database:
        """The database the ids come from."""
        return self._db

    # -- reserving

    async def _fetch(self, n: int, txn: Transaction | None) -> list[int]:
        if self._counter is not None:
            first = self._counter + 1
            self._counter += n
            return list(range(first, first + n))
        run = txn if txn is not None else self._db
        seq = self.sequence_name
        if n == 1:
            row = await run.fetchone(f"SELECT nextval('{seq}')")
            assert row is not None
            return [int(row[0])]
        rows = await run.fetchall(f"SELECT nextval('{seq}') FROM generate_series(1, ?)", (n,))
        return sorted(int(r[0]) for r in rows)

    async def _reserve(self, n: int, txn: Transaction | None = None) -> list[int]:
        # every check before any state changes: a bad n must not leave the counter or a block record behind
        n = whole("n (the number of ids to reserve)", n)
        if n > MAX_IDS_PER_CALL:
            raise ValueError(
                f"cannot reserve {n} ids in one call (at most {MAX_IDS_PER_CALL:,}); reserve them in parts"
            )
        if self._closed:
            raise IdGeneratorError(f"id generator for stream {self.stream_name!r} is closed")
        tracker = self._tracker
        if self._counter is not None:
            if self._counter + n > MAX_ID:
                raise IdGeneratorError(
                    f"stream {self.stream_name!r} is at id {self._counter}: {n} more would pass the largest "
                    f"signed 64-bit id ({MAX_ID})"
                )
            while self._counter + n > self._block_end:  # type: ignore[operator]
                await self._extend_block(self._counter + n, txn)
            # no await between allocation and registration
            tracker._local_heap()
            ids = await self._fetch(n, txn)
            tracker.reserve(ids)
            self._extend_ahead()
            return ids
        handle = tracker.begin_fetch()
        fetched: list[int] = []
        try:
            fetched = await self._fetch(n, txn)
        finally:
            tracker.end_fetch(handle, fetched)
        return fetched

    def _complete(self, ids: list[int]) -> None:
        self._tracker.complete(ids)

    async def _extend_block(self, needed: int, txn: Transaction | None) -> None:
        """Record in ``stream_id_blocks`` that ids up to ``needed`` (and a block beyond) may be handed out.

        Before this, a SQLite writer restarted after a crash took its counter
        from the tables and ``stream_positions`` only, and could hand out again
        an id it had already used for a rolled-back or empty fact that readers
        had seen a POSITION past: they then dropped the new fact as stale.
        Inside a caller's transaction the record goes through it (the database
        is held by it); should it roll back, the record is written again.
        """
        upto = min(needed + SQLITE_ID_BLOCK, MAX_ID)
        await self._write_block(upto, txn)
        if txn is not None:
            # not awaited in the hook: rollback hooks run while the transaction still holds the database
            txn.call_after_rollback(self._rewrite_block_later, upto)
        self._block_end = max(self._block_end or 0, upto)

    def _extend_ahead(self) -> None:
        """Past half of the recorded block: record the next one in the background.

        A reservation that outgrows the block waits for the record to be
        written, behind whatever holds the database (on SQLite, the
        transaction a writer is running): a writer that makes its next
        transaction while the database runs the previous one would wait for
        it at every block. Written ahead, that wait is rare.
        """
        counter, end = self._counter, self._block_end
        if counter is None or end is None or self._ahead or self._closed or end - counter > SQLITE_ID_BLOCK // 2:
            return
        self._ahead = True
        task = asyncio.get_running_loop().create_task(self._write_ahead(counter))
        self._block_writes.add(task)
        task.add_done_callback(self._block_writes.discard)

    async def _write_ahead(self, needed: int) -> None:
        try:
            await self._extend_block(needed, None)
        except Exception as err:  # noqa: BLE001 - a reservation that needs the block writes it (and reports)
            logger.debug("stream %s: recording the next id block ahead of use failed: %s", self.stream_name, err)
        finally:
            self._ahead = False

    def _rewrite_block_later(self, upto: int) -> None:
        task = asyncio.get_running_loop().create_task(self._rewrite_block(upto))
        self._block_writes.add(task)
        task.add_done_callback(self._block_writes.discard)

    async def _rewrite_block(self, upto: int) -> None:
        """Record again a block whose record a rolled-back transaction took with it.

        Should that fail too (the database locked, closed), the generator
        must not go on believing it recorded: ids it hands out would not be
        durable, and a restart after a crash could give them out again. The
        next reservation then records a block before it hands out an id.
        """
        try:
            await self._write_block(upto, None)
        except Exception as err:  # noqa: BLE001 - a background task: nobody else would see it
            if self._counter is not None and self._block_end is not None:
                self._block_end = min(self._block_end, self._counter)
            logger.warning("stream %s: could not record the id block again after a rolled-back transaction "
                           "(%s); the next id reserved records it first", self.stream_name, redact_text(str(err)))

    async def _write_block(self, upto: int, txn: Transaction | None) -> None:
        await (txn if txn is not None else self._db).execute(
            "INSERT INTO stream_id_blocks (stream_name, reserved_upto) VALUES (?, ?) "
            "ON CONFLICT (stream_name) DO UPDATE SET reserved_upto = MAX(stream_id_blocks.reserved_upto, excluded.reserved_upto)",
            (self.stream_name, upto),
        )

    @asynccontextmanager
    async def get_next(self) -> AsyncIterator[int]:
        """Reserve one id; it completes when the block exits (normally or not)."""
        ids = await self._reserve(1)
        try:
            yield ids[0] * self._sign
        finally:
            self._tracker.complete(ids)

    @asynccontextmanager
    async def get_next_mult(self, n: int) -> AsyncIterator[list[int]]:
        """Reserve ``n`` ids in one round trip (ascending; descending for backwards streams)."""
        ids = await self._reserve(n)
        try:
            yield [i * self._sign for i in ids]
        finally:
            self._tracker.complete(ids)

    async def get_next_txn(self, txn: Transaction) -> int:
        """Reserve one id inside ``txn``; it completes after the commit or the rollback."""
        return (await self.get_next_mult_txn(txn, 1))[0]

    async def get_next_mult_txn(self, txn: Transaction, n: int) -> list[int]:
        """Reserve ``n`` ids inside ``txn``; they complete after the commit or the rollback.

        ``txn`` must be open: ids reserved in a finished transaction would
        never complete, and the stream's position would stop there for good.
        """
        if not isinstance(txn, Transaction):
            raise TypeError(
                f"pass the transaction from db.transaction(), not a {type(txn).__name__}: "
                "'async with db.transaction() as txn: await gen.get_next_txn(txn)'; "
                "outside a transaction use 'async with gen.get_next() as stream_id'"
            )
        if txn.database is not self._db:
            raise IdGeneratorError("the transaction belongs to another database than the id generator")
        txn.ensure_open()
        ids = await self._reserve(n, txn)
        try:
            txn.call_after_commit(self._complete, ids)
            txn.call_after_rollback(self._complete, ids)
        except BaseException:
            self._complete(ids)  # the transaction ended meanwhile: complete now rather than never
            raise
        return [i * self._sign for i in ids]

    # -- reading positions (token orientation: always growing)

    def current_token(self) -> int:
        """Linear position (the minimum over writers)."""
        return self._tracker.current_token()

    def current_token_for_writer(self, name: str) -> int:
        """Position of writer ``name``."""
        return self._tracker.current_token_for_writer(name)

    def max_token(self) -> int:
        """The maximum position over writers."""
        return self._tracker.max_token()

    def positions(self) -> dict[str, int]:
        """Every writer's position."""
        return self._tracker.positions()

    def persisted_upto(self) -> int:
        """Largest position with every fact at or below it known complete (>= current_token())."""
        return self._tracker.persisted_upto()

    def advance(self, instance_name: str, new_id: int) -> None:
        """Record a position learned from replication (POSITION / RDATA token)."""
        self._tracker.advance(instance_name, new_id)

    def add_listener(self, cb: Listener) -> None:
        """Call ``cb(stream_name, instance_name, old, new)`` synchronously when the local position advances.

        The facts in (old, new] written by this writer are now complete. When an
        idle writer catches up with the others the range may hold no fact of
        its own, so select rows by instance as well as by id.
        """
        self._tracker.add_listener(cb)

    def remove_listener(self, cb: Listener) -> None:
        """Stop calling ``cb``."""
        self._tracker.remove_listener(cb)

    async def wait_for(self, instance_name: str | None, position: int, timeout: float) -> None:
        """Wait until writer ``instance_name`` (None: the linear position) reaches ``position``.

        Raises :class:`PositionWaitTimeout` (a ``TimeoutError``) after
        ``timeout`` seconds, saying how far the writer got. ``position`` is in
        the positive form, on backwards streams too.
        """
        if instance_name is not None:
            text("instance_name", instance_name)
        whole("position", position, 0, MAX_ID)
        seconds("timeout", timeout, zero=True)

        def reached() -> int:
            if instance_name is None:
                return self._tracker.current_token()
            return self._tracker.current_token_for_writer(instance_name)

        if reached() >= position:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (position, fut)
        self._waiters.setdefault(instance_name, []).append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            raise PositionWaitTimeout(self.stream_name, instance_name, position, reached(), timeout) from None
        finally:
            waiting = self._waiters.get(instance_name)
            if waiting is not None and entry in waiting:
                waiting.remove(entry)

    def _on_change(self, instance_name: str, old: int, new: int) -> None:
        for key in (instance_name, None):
            waiting = self._waiters.get(key)
            if not waiting:
                continue
            now = new if key is not None else self._tracker.current_token()
            keep = []
            for pos, fut in waiting:
                if pos <= now:
                    if not fut.done():
                        fut.set_result(None)
                else:
                    keep.append((pos, fut))
            self._waiters[key] = keep

    # -- persisting the local position

    def _on_local_advance(self, stream_name: str, instance_name: str, old: int, new: int) -> None:
        if self._closed:
            return
        if self._flush_task is None or self._flush_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # flushed on close()
            self._flush_task = loop.create_task(self._flush_later())

    async def _flush_later(self) -> None:
        # Debounce: one upsert covers every advance made meanwhile, at most one per flush_interval,
        # so the position record costs no round trip per id. While the position keeps moving, the
        # next upsert waits its interval too (an upsert at once after each, as this did, was an
        # endless run of them on a busy writer, each queued before its next transaction).
        while not self._closed:
            self._flush_sleeping = True
            try:
                await asyncio.sleep(self.flush_interval)
            finally:
                self._flush_sleeping = False
            if self._closed or not await self._flush_loop(once=True):
                return

    async def _flush_loop(self, once: bool = False) -> bool:
        # The background flush: a database outage (PostgreSQL gone, a SQLite file another process
        # keeps locked past the busy timeout: both DatabaseUnavailable) is waited out with backoff,
        # logged once (flush_positions() and close() try once instead). ``once``: return after one
        # upsert, True if the position has moved on since (the caller flushes again later).
        wrote = False
        try:
            while True:
                pos = self._tracker.current_token_for_writer(self.instance_name)
                if pos <= self._flushed:
                    self._outage.recovered()
                    return False
                if once and wrote:
                    return True
                try:
                    await self._write_position(pos)
                except DatabaseUnavailable as err:
                    delay = self._outage.failed(err)
                    if self._closed:
                        return False
                    await asyncio.sleep(delay)
                    continue
                self._flushed = max(self._flushed, pos)
                wrote = True
        except Exception:  # noqa: BLE001 - a hint only; the tables are the truth
            logger.exception("stream %s: could not record the position in stream_positions", self.stream_name)
            return False

    async def _write_position(self, pos: int) -> None:
        biggest = "GREATEST" if self._db.engine == "postgres" else "MAX"
        await self._db.execute(
            "INSERT INTO stream_positions (stream_name, instance_name, stream_id) VALUES (?, ?, ?) "
            "ON CONFLICT (stream_name, instance_name) DO UPDATE SET "
            f"stream_id = {biggest}(stream_positions.stream_id, excluded.stream_id)",
            (self.stream_name, self.instance_name, pos),
        )

    async def flush_positions(self) -> None:
        """Record the local position in ``stream_positions`` now; return once it is recorded, or raise.

        On return, ``stream_positions`` holds at least the position this
        writer had when the call began (a reader's generator has nothing to
        record and returns at once). One attempt, no retry: when the database
        is unavailable (PostgreSQL down or its connection cut, a SQLite file
        another process keeps locked past the busy timeout) it raises
        :class:`~factstream.store.database.DatabaseUnavailable` naming the
        stream and the position not recorded, after waiting at most what one
        statement waits (the busy timeout, the connect timeout). Any other
        database error is raised as it is. Nothing is lost either way: the
        background recording keeps trying, and a restart recovers positions
        from the backing tables (``stream_positions`` is a hint).

        The position is also recorded in the background, at most once per
        ``flush_interval`` seconds (0.01 by default); call this where you must
        know it is recorded, e.g. before a planned shutdown (:meth:`close`
        records it too, but logs rather than raises).
        """
        if not self.is_writer:
            return
        pos = self._tracker.current_token_for_writer(self.instance_name)
        if pos <= self._flushed:
            return
        try:
            await self._write_position(pos)
        except DatabaseUnavailable as err:
            raise DatabaseUnavailable(
                f"stream {self.stream_name!r}: position {pos} of {self.instance_name!r} was not recorded in "
                f"stream_positions: {err}"
            ) from None
        self._flushed = max(self._flushed, pos)

    async def close(self) -> None:
        """Record the local position and stop; the database stays open (it is the caller's).

        Safe during an outage: when the database is unavailable it logs one
        warning (no traceback) saying what was not recorded and stops,
        after waiting at most one statement's timeout for it (it does not
        then also try to give back the ids recorded ahead of use). Use
        :meth:`flush_positions` first to know whether the position was recorded.
        """
        if self._closed:
            return
        try:
            reachable = await self._flush_on_close()
            if self._block_writes:
                await asyncio.gather(*self._block_writes, return_exceptions=True)
            if (reachable and self._counter is not None and self._block_end is not None
                    and self._block_end > self._counter):
                await self._give_back_block()
        finally:
            self._closed = True
            task = self._flush_task
            if task is not None and not task.done():
                if self._flush_sleeping or self._outage.ongoing:
                    task.cancel()  # nothing left to write (flush_positions() just did), or nowhere to write it
                await asyncio.wait([task])
            for waiting in self._waiters.values():
                for _, fut in waiting:
                    if not fut.done():
                        fut.cancel()
            self._waiters.clear()
            key = _sqlite_key(self._db, self.stream_name)
            if _SQLITE_WRITERS.get(key) is self:
                del _SQLITE_WRITERS[key]

    async def _flush_on_close(self) -> bool:
        """:meth:`flush_positions` for :meth:`close`: logs instead of raising; False if the database is unavailable.

        Again while ids completing meanwhile moved the position on, as the stop's own record.
        """
        try:
            await self.flush_positions()
            while self.is_writer and self._tracker.current_token_for_writer(self.instance_name) > self._flushed:
                await self.flush_positions()
        except DatabaseUnavailable as err:
            block = ""
            if self._counter is not None and self._block_end is not None and self._block_end > self._counter:
                block = (f"; could not give back the ids recorded ahead of use either: a restart continues after "
                         f"position {self._block_end} instead of {self._counter}")
            logger.warning("closing while the database is unavailable: %s%s (a restart recovers positions from "
                           "the tables)", redact_text(str(err)), block)
            return False
        except Exception:  # noqa: BLE001 - closing goes on; the tables are the truth
            logger.exception("stream %s: could not record the position in stream_positions", self.stream_name)
        return True

    async def _give_back_block(self) -> None:
        """A clean stop: give back the ids recorded ahead of use, so a restart does not skip them.

        Only a saving: with the database unavailable (a SQLite file another
        process keeps locked) the restart skips them instead, which is safe,
        so close() still stops rather than raising.
        """
        assert self._counter is not None
        try:
            await self._db.execute(
                "UPDATE stream_id_blocks SET reserved_upto = ? WHERE stream_name = ?", (self._counter, self.stream_name)
            )
        except DatabaseUnavailable as err:
            logger.warning(
                "stream %s: could not give back the ids recorded ahead of use (%s); a restart continues after "
                "position %d instead of %d", self.stream_name, err, self._block_end, self._counter,
            )
            return
        self._block_end = self._counter

    def __repr__(self) -> str:
        return (
            f"<IdGenerator {self.stream_name!r} instance={self.instance_name!r} "
            f"positions={self.positions()} backwards={self.backwards}>"
        )


# ----------------------------------------------------------------------------- startup


def _normalise_tables(tables: Sequence[Sequence[str | None]]) -> list[TableSpec]:
    shape = "(table, instance_column or None, id_column)"
    if isinstance(tables, (str, bytes)) or not isinstance(tables, Iterable):
        raise TypeError(f"tables must be a list of {shape}, got {type(tables).__name__} {tables!r}")

    def name(spec: object, what: str, value: object) -> str:
        if not isinstance(value, str):
            raise TypeError(
                f"table spec {spec!r}: the {what} must be a name (str), got {value!r}; "
                f"only the instance column may be None: {shape}"
            )
        return _ident(value, what)

    out: list[TableSpec] = []
    for spec in tables:
        if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence) or len(spec) != 3:
            raise IdGeneratorError(f"table spec {spec!r} must be {shape}")
        table, inst, col = spec
        out.append((name(spec, "table", table), None if inst is None else name(spec, "instance column", inst),
                    name(spec, "id column", col)))
    return out


async def _max_in_tables(run: Database | Transaction, tables: list[TableSpec], backwards: bool) -> int:
    """Largest id in any backing table, token orientation (0 if all empty)."""
    best = 0
    for table, _inst, col in tables:
        agg = "MIN" if backwards else "MAX"
        row = await run.fetchone(f"SELECT {agg}({col}) FROM {table}")
        if row and row[0] is not None:
            best = max(best, -int(row[0]) if backwards else int(row[0]))
    return best


async def _writer_maxima_above(
    run: Database | Transaction,
    tables: list[TableSpec],
    backwards: bool,
    above: int,
    sole_writer: str | None = None,
) -> dict[str, int]:
    """Per writer, the largest id above ``above`` in the backing tables (token orientation).

    Rows of a table without an instance column belong to ``sole_writer`` (the
    only writer of a single-writer stream); otherwise such tables are skipped.
    """
    out: dict[str, int] = {}
    for table, inst, col in tables:
        if inst is None:
            if sole_writer is None:
                continue
            agg, cmp, bound = ("MIN", "<", -above) if backwards else ("MAX", ">", above)
            row = await run.fetchone(f"SELECT {agg}({col}) FROM {table} WHERE {col} {cmp} ?", (bound,))
            if row and row[0] is not None:
                pos = -int(row[0]) if backwards else int(row[0])
                out[sole_writer] = max(out.get(sole_writer, 0), pos)
            continue
        if backwards:
            sql = f"SELECT {inst}, -MIN({col}) FROM {table} WHERE {col} < ? GROUP BY {inst}"
            params: tuple[int, ...] = (-above,)
        else:
            sql = f"SELECT {inst}, MAX({col}) FROM {table} WHERE {col} > ? GROUP BY {inst}"
            params = (above,)
        for name, pos in await run.fetchall(sql, params):
            if name is not None and pos is not None:
                out[name] = max(out.get(name, 0), int(pos))
    return out


async def _stream_positions(run: Database | Transaction, stream_name: str) -> dict[str, int]:
    rows = await run.fetchall(
        "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?", (stream_name,)
    )
    return {str(name): int(pos) for name, pos in rows}


async def _load_postgres(
    txn: Transaction,
    stream_name: str,
    writers: Sequence[str],
    tables: list[TableSpec],
    seq: str,
    backwards: bool,
) -> dict[str, int]:
    # One startup at a time per stream: creating a sequence is not race-free.
    await txn.execute("SELECT pg_advisory_xact_lock(?)", (zlib.crc32(f"factstream:{stream_name}".encode()),))
    await txn.execute(f"CREATE SEQUENCE IF NOT EXISTS {seq}")
    row = await txn.fetchone(f"SELECT last_value, is_called FROM {seq}")
    assert row is not None
    last_value, is_called = int(row[0]), bool(row[1])
    head = last_value if is_called else last_value - 1
    table_max = await _max_in_tables(txn, tables, backwards)
    recorded = await _stream_positions(txn, stream_name)
    recorded_max = max(recorded.values(), default=0)
    if not is_called and last_value == 1:
        # Fresh sequence: setval(n, true) makes the next id n+1 >= 2, so that
        # 1 keeps meaning "empty" (no START WITH, which a later RESTART undoes).
        await txn.execute("SELECT setval(?, ?, true)", (seq, max(1, table_max, recorded_max)))
    else:
        if head < table_max:
            logger.warning(
                "stream %s: sequence %s is at %d but the tables hold ids up to %d; moving the sequence to %d",
                stream_name,
                seq,
                head,
                table_max,
                table_max,
            )
            await txn.execute("SELECT setval(?, ?, true)", (seq, table_max))
            head = table_max
        if head < recorded_max:
            raise SequenceBehindError(
                f"stream {stream_name!r}: sequence {seq} is at {head} but stream_positions says a writer "
                f"reached {recorded_max}, so ids up to {recorded_max} may already have been handed out. "
                f"If the database was restored from an older backup, check the data, then run "
                f"\"SELECT setval('{seq}', {recorded_max})\" and restart."
            )
    known = [recorded[w] for w in writers if w in recorded]
    floor = min(known) if len(known) == len(set(writers)) else min(known + [1])
    positions = {w: recorded.get(w, floor) for w in writers}
    sole = writers[0] if len(writers) == 1 else None
    for name, pos in (await _writer_maxima_above(txn, tables, backwards, floor, sole)).items():
        if name in positions:
            positions[name] = max(positions[name], pos)
    return positions


async def create_id_generator(
    db: Database,
    *,
    stream_name: str,
    instance_name: str,
    writers: Sequence[str] = ("master",),
    tables: Sequence[Sequence[str | None]] = (),
    sequence_name: str | None = None,
    backwards: bool = False,
    heap_class: Any = None,
) -> IdGenerator:
    """Recover a stream's positions from ``db`` and return its id generator.

    ``tables`` lists the backing tables as ``(table, instance_column, id_column)``
    (``instance_column`` may be None for a single-writer table). With one writer
    this is a single-writer stream; several writers need PostgreSQL. A process
    whose ``instance_name`` is not among ``writers`` is a reader: it tracks
    positions (``advance``) but cannot reserve ids. ``sequence_name`` is for
    PostgreSQL; SQLite has no sequences, so there it is checked but not used.
    Wrong argument types are a ``TypeError`` before anything is read or written.
    """
    if not isinstance(db, Database):
        raise TypeError(f"create_id_generator() takes the Database from connect(), not a {type(db).__name__}")
    writers = check_names(stream_name, instance_name, writers)
    if not isinstance(backwards, bool):
        raise TypeError(f"backwards must be True or False, got {type(backwards).__name__} {backwards!r}")
    if sequence_name is not None:
        _ident(text("sequence_name", sequence_name), "sequence name")
    specs = _normalise_tables(tables)
    await migrate(db, ["streams"])
    is_writer = instance_name in writers
    if db.engine == "sqlite":
        if len(writers) > 1:
            raise IdGeneratorError(
                f"stream {stream_name!r} has {len(writers)} writers ({', '.join(writers)}) but SQLite supports "
                "only one writer per stream, in one process; use PostgreSQL for several writers"
            )
        key = _sqlite_key(db, stream_name)
        if is_writer and key in _SQLITE_WRITERS:
            raise IdGeneratorError(
                f"stream {stream_name!r} already has a writer id generator on {shown_url(db.url)} in this process; "
                "share it (or close() it first): two counters would hand out the same ids"
            )
        recorded = await _stream_positions(db, stream_name)
        table_max = await _max_in_tables(db, specs, backwards)
        row = await db.fetchone("SELECT reserved_upto FROM stream_id_blocks WHERE stream_name = ?", (stream_name,))
        handed_out = int(row[0]) if row else 0  # a crashed writer may have used ids up to here
        start = max(1, table_max, max(recorded.values(), default=1), handed_out if is_writer else 0)
        tracker = PositionTracker(stream_name, instance_name, writers, {writers[0]: start}, heap_class=heap_class)
        gen = IdGenerator(db, tracker, backwards=backwards, sequence_name=None, counter=start if is_writer else None)
        if is_writer and start > max(table_max, *recorded.values(), 1):
            # Restarted past ids a crashed writer handed out (stream_id_blocks): nothing in the
            # tables or stream_positions shows that position yet, so a reader checking the
            # writer's first POSITION against the database called it unbacked ("forged?").
            # Recorded before the generator is handed out, so it is backed before it is announced.
            await gen._write_position(start)
        if is_writer:
            _SQLITE_WRITERS[key] = gen
        return gen
    seq = _ident(sequence_name or default_sequence_name(stream_name), "sequence name")
    async with db.transaction() as txn:
        positions = await _load_postgres(txn, stream_name, writers, specs, seq, backwards)
    tracker = PositionTracker(stream_name, instance_name, writers, positions, heap_class=heap_class)
    return IdGenerator(db, tracker, backwards=backwards, sequence_name=seq, counter=None)
