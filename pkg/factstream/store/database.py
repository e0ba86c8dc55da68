"""One small async interface over SQLite and PostgreSQL.

(Over 600 lines on purpose: the interface and its only two engines, each
about 200 lines, read best side by side; every verb is implemented in both.)

Why this shape: every component (stream ids, event store, replication
catch-up) needs the same four verbs and a transaction with after-commit /
after-rollback hooks, on an embedded database by default and on PostgreSQL in
real deployments. SQL is written once with ``?`` placeholders; for psycopg it
is rewritten to ``%s`` (a literal ``%`` is escaped).

* SQLite runs on the stdlib ``sqlite3`` in one dedicated thread (WAL mode).
  An :class:`asyncio.Lock` serialises transactions, so statements of two tasks
  never interleave inside one transaction.
* PostgreSQL uses psycopg 3 ``AsyncConnection`` objects from a small pool;
  each transaction holds one connection until it ends.

Inside ``async with db.transaction() as txn`` the same task may also call
``db.execute(...)`` (it is routed into the open transaction instead of
deadlocking on the lock); a nested ``db.transaction()`` joins the outer one.
A writer with many small statements sends them together:
``txn.execute_batch(steps)`` (one trip per batch instead of one per
statement), or ``db.run_transaction(steps)`` (``BEGIN``, the steps and
``COMMIT`` in one trip).

SQLite's ``synchronous = NORMAL`` in WAL mode: a committed transaction
survives a crash of the process; a power loss or OS crash may lose the last
ones committed (the file stays consistent).

When PostgreSQL cannot be reached or a connection dies under a statement
(a restart, a failover, ``pg_terminate_backend``), the call raises
:class:`DatabaseUnavailable`: a clear message with the URL's password masked
and the driver's text redacted, never the driver's own exception. Nothing is
retried here (a statement cut off may or may not have committed); callers
that must ride out an outage retry whole transactions with backoff
(:class:`factstream.backoff.Outage`). The other pooled connections, opened
before the outage, are dropped at once so the next call opens a fresh one.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import select
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from ..errors import FactstreamError
from ..redaction import redact_text, redact_url

__all__ = ["Database", "DatabaseError", "DatabaseUnavailable", "Transaction", "connect", "to_pyformat"]

logger = logging.getLogger(__name__)

Params = Sequence[Any]
Row = tuple[Any, ...]
#: One step of :meth:`Transaction.execute_batch`: a statement and its parameter tuples (None: run once, no parameters).
Step = tuple[str, "Sequence[Params] | None"]

#: The transaction the current task has open, per database (routes db.* calls into it).
_current_txn: contextvars.ContextVar[Transaction | None] = contextvars.ContextVar(
    "factstream_current_txn", default=None
)


class DatabaseError(FactstreamError):
    """A database URL, connection or usage problem (SQL errors are the driver's own)."""


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached, or the connection died under a statement; retrying later may work."""


@functools.lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Rewrite ``?`` placeholders (outside quotes) to ``%s`` and escape ``%`` for psycopg."""
    out: list[str] = []
    quote: str | None = None
    for ch in sql:
        if quote is not None:
            if ch == quote:
                quote = None
            out.append("%%" if ch == "%" else ch)
        elif ch in ("'", '"'):
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == "%":
            out.append("%%")
        else:
            out.append(ch)
    return "".join(out)


class Transaction:
    """An open transaction: the four verbs plus after-commit / after-rollback hooks.

    Hooks run in registration order once the outcome is known; a hook may be a
    plain function or return an awaitable (awaited). A failing hook is logged
    and does not stop the others, since the transaction's outcome is final.
    """

    def __init__(self, db: Database, conn: Any) -> None:
        self._db = db
        self._conn = conn
        self._after_commit: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._after_rollback: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self.open = True

    def ensure_open(self) -> None:
        """Raise :class:`DatabaseError` unless the transaction is still open.

        Once ``async with db.transaction()`` has exited, a statement would run
        outside any transaction (on PostgreSQL, on a connection back in the
        pool and maybe in another task's hands) and a hook would never run.
        """
        if not self.open:
            raise DatabaseError(
                "transaction already finished (committed or rolled back); run the statement inside "
                "'async with db.transaction() as txn:', or start a new transaction"
            )

    @property
    def engine(self) -> str:
        """``"sqlite"`` or ``"postgres"``."""
        return self._db.engine

    @property
    def database(self) -> Database:
        """The database this transaction belongs to."""
        return self._db

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement; returns the driver's row count (-1 if unknown)."""
        self.ensure_open()
        return await self._db._txn_execute(self._conn, sql, params)

    async def executemany(self, sql: str, seq: Iterable[Params]) -> None:
        """Run one statement once per parameter tuple."""
        self.ensure_open()
        await self._db._txn_executemany(self._conn, sql, seq)

    async def execute_batch(self, steps: Sequence[Step]) -> None:
        """Run ``steps`` in order in one trip to the database: each statement once per parameter tuple.

        A writer with many small units of work (``SAVEPOINT``, its inserts,
        ``RELEASE`` or ``ROLLBACK TO``, and again) pays one hand-over to the
        SQLite thread, or one pipelined round trip to PostgreSQL, instead of
        one per statement. The first failing statement raises; the
        transaction then rolls back as usual.
        """
        self.ensure_open()
        if steps:
            await self._db._txn_execute_batch(self._conn, steps)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """All rows of a query, as tuples."""
        self.ensure_open()
        return await self._db._txn_fetchall(self._conn, sql, params)

    async def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """The first row of a query, or None."""
        self.ensure_open()
        rows = await self._db._txn_fetchall(self._conn, sql, params)
        return rows[0] if rows else None

    def call_after_commit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after this transaction commits."""
        self.ensure_open()
        self._after_commit.append((fn, args))

    def call_after_rollback(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` after this transaction rolls back (or fails to commit)."""
        self.ensure_open()
        self._after_rollback.append((fn, args))

    async def _run_hooks(self, committed: bool) -> None:
        hooks = self._after_commit if committed else self._after_rollback
        self._after_commit = []
        self._after_rollback = []
        for fn, args in hooks:
            try:
                result = fn(*args)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001 - the outcome is final; report and go on
                logger.exception("after-%s hook %r failed", "commit" if committed else "rollback", fn)


class Database:
    """Base of the two engines; use :func:`connect` to get one."""

    engine: str = ""

    def __init__(self, url: str) -> None:
        self.url = url
        self._closed = False
        #: run by close() before the connections go: resources tied to this database (writer claims)
        self._on_close: dict[int, Callable[[], Awaitable[None]]] = {}

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (a closed database cannot be used again; connect() anew)."""
        return self._closed

    def _ensure_open(self) -> None:
        if self._closed:
            raise DatabaseError(f"database {_shown(self.url)} is closed; connect() again")

    async def _close_attached(self) -> None:
        """Release what was tied to this database (see ``_on_close``), before its connections close."""
        while self._on_close:
            _, release = self._on_close.popitem()
            try:
                await release()
            except Exception:  # noqa: BLE001 - closing goes on; report it
                logger.exception("releasing %r while closing the database failed", release)

    # -- the four verbs, outside an explicit transaction (autocommit)

    async def execute(self, sql: str, params: Params = ()) -> int:
        """Run one statement in its own transaction (or the task's open one)."""
        txn = self._open_txn()
        if txn is not None:
            return await txn.execute(sql, params)
        return await self._auto_execute(sql, params)

    async def executemany(self, sql: str, seq: Iterable[Params]) -> None:
        """Run one statement per parameter tuple, atomically."""
        async with self.transaction() as txn:
            await txn.executemany(sql, seq)

    async def fetchall(self, sql: str, params: Params = ()) -> list[Row]:
        """All rows of a query, as tuples."""
        txn = self._open_txn()
        if txn is not None:
            return await txn.fetchall(sql, params)
        return await self._auto_fetchall(sql, params)

    async def fetchone(self, sql: str, params: Params = ()) -> Row | None:
        """The first row of a query, or None."""
        rows = await self.fetchall(sql, params)
        return rows[0] if rows else None

    async def run_transaction(self, steps: Sequence[Step]) -> None:
        """Run ``steps`` (see :meth:`Transaction.execute_batch`) as one transaction, in one trip to the database.

        ``BEGIN``, the steps and ``COMMIT`` go together (one hand-over to the
        SQLite thread, one pipelined round trip to PostgreSQL); any failure
        rolls the whole transaction back and raises. For a writer whose
        statements need no answer from the database and no hooks; inside an
        open transaction of the task the steps join it.
        """
        outer = self._open_txn()
        if outer is not None:
            await outer.execute_batch(steps)
            return
        await self._run_transaction(steps)

    async def _run_transaction(self, steps: Sequence[Step]) -> None:
        async with self.transaction() as txn:
            await txn.execute_batch(steps)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Commit on normal exit, roll back on exception; hooks run afterwards."""
        outer = self._open_txn()
        if outer is not None:  # nested: join the outer transaction
            yield outer
            return
        async with self._begin() as conn:
            txn = Transaction(self, conn)
            token = _current_txn.set(txn)
            try:
                try:
                    yield txn
                finally:
                    _current_txn.reset(token)
            except BaseException:
                txn.open = False
                try:
                    await self._rollback(conn)
                finally:
                    await txn._run_hooks(committed=False)
                raise
            txn.open = False
            try:
                await self._commit(conn)
            except BaseException:
                try:
                    await self._rollback(conn)
                except Exception:  # noqa: BLE001 - the commit error is the one to report
                    pass
                await txn._run_hooks(committed=False)
                raise
        await txn._run_hooks(committed=True)

    async def close(self) -> None:
        """Close every connection (idempotent)."""
        raise NotImplementedError

    async def __aenter__(self) -> Database:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _open_txn(self) -> Transaction | None:
        txn = _current_txn.get()
        if txn is not None and txn._db is self and txn.open:
            return txn
        return None

    # -- engine hooks
    async def _auto_execute(self, sql: str, params: Params) -> int:
        raise NotImplementedError

    async def _auto_fetchall(self, sql: str, params: Params) -> list[Row]:
        raise NotImplementedError

    def _begin(self) -> Any:
        raise NotImplementedError

    async def _commit(self, conn: Any) -> None:
        raise NotImplementedError

    async def _rollback(self, conn: Any) -> None:
        raise NotImplementedError

    async def _txn_execute(self, conn: Any, sql: str, params: Params) -> int:
        raise NotImplementedError

    async def _txn_executemany(self, conn: Any, sql: str, seq: Iterable[Params]) -> None:
        raise NotImplementedError

    async def _txn_execute_batch(self, conn: Any, steps: Sequence[Step]) -> None:
        raise NotImplementedError

    async def _txn_fetchall(self, conn: Any, sql: str, params: Params) -> list[Row]:
        raise NotImplementedError


def _shown(url: str) -> str:
    """``url`` as it may appear in a message: a password in the authority, the query or a ``password=`` masked."""
    return redact_text(redact_url(url))


def _idle_and_alive(conn: Any) -> bool:
    """Whether an idle pooled PostgreSQL connection is still open at the server's end.

    An idle connection has nothing to read unless the server ended the
    session (its last words, then EOF): one poll of the socket, no round trip.
    """
    if conn.closed:
        return False
    poller = select.poll()
    try:
        poller.register(conn.pgconn.socket, select.POLLIN)
        return not poller.poll(0)
    except (OSError, ValueError):  # no socket any more
        return False


async def _close_quietly(conn: Any) -> None:
    try:
        await conn.close()
    except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
        pass


def _cut_off(err: BaseException) -> bool:
    """Whether a PostgreSQL error means the connection is gone, not that a statement failed.

    An error without an SQLSTATE comes from the client (the socket, the
    pipeline's state); class 08 is a connection exception and 57P0x the
    server shutting the session down. Everything else (a statement timeout,
    57014, a deadlock, a serialization failure) leaves the connection
    usable, and the caller decides.
    """
    state = getattr(err, "sqlstate", None)
    return state is None or state.startswith("08") or state.startswith("57P0")


def _driver_text(err: BaseException) -> str:
    """A driver error's message on one line, any password in it masked."""
    text = " ".join(str(err).split()) or type(err).__name__
    return redact_text(text)


# ----------------------------------------------------------------------------- SQLite


class SqliteDatabase(Database):
    """SQLite through the stdlib driver, in one dedicated thread."""

    engine = "sqlite"

    def __init__(self, url: str, path: str) -> None:
        super().__init__(url)
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="factstream-sqlite")
        self._lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None

    async def _open(self) -> None:
        def opener() -> sqlite3.Connection:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA busy_timeout = 30000")
            if self.path != ":memory:":
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("PRAGMA synchronous = NORMAL")
            return conn

        try:
            self._conn = await self._run(opener)
        except sqlite3.Error as err:
            self._executor.shutdown(wait=False)
            self._closed = True
            raise DatabaseError(
                f"cannot open SQLite database {self.path!r} ({err}); check that its folder exists and is "
                "writable (sqlite:///relative.db, sqlite:////absolute/path.db)"
            ) from err

    def _submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        self._ensure_open()
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._submit(fn, *args)

    async def _queue(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a self-contained job (one call in the database thread), holding the lock only to queue it.

        The thread runs jobs in the order they were queued: this one after
        all a lock holder queued before, and before anything queued by the
        next holder. So the next job (a writer's next transaction) is queued
        at once and starts the moment this one ends, not once the event loop
        has come round to hand the lock over.
        """
        async with self._lock:
            done = self._submit(fn, *args)
        return await done

    def _c(self) -> sqlite3.Connection:
        assert self._conn is not None
        return self._conn

    def _do_execute(self, sql: str, params: Params) -> int:
        return self._c().execute(sql, tuple(params)).rowcount

    def _do_fetchall(self, sql: str, params: Params) -> list[Row]:
        return self._c().execute(sql, tuple(params)).fetchall()

    def _do_executemany(self, sql: str, seq: list[Params]) -> None:
        self._c().executemany(sql, seq)

    def _do_batch(self, steps: Sequence[Step]) -> None:
        conn = self._c()
        for sql, seq in steps:
            if seq is None:
                conn.execute(sql)
            else:
                conn.executemany(sql, seq)

    def _do_transaction(self, steps: Sequence[Step]) -> None:
        conn = self._c()
        conn.execute("BEGIN IMMEDIATE")
        try:
            self._do_batch(steps)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    async def _run_transaction(self, steps: Sequence[Step]) -> None:
        await self._queue(self._do_transaction, steps)

    async def _auto_execute(self, sql: str, params: Params) -> int:
        return int(await self._queue(self._do_execute, sql, params))

    async def _auto_fetchall(self, sql: str, params: Params) -> list[Row]:
        rows: list[Row] = await self._queue(self._do_fetchall, sql, params)
        return rows

    @asynccontextmanager
    async def _begin(self) -> AsyncIterator[Any]:
        async with self._lock:
            # IMMEDIATE takes the write lock up front, so two processes on one
            # file never deadlock upgrading a read transaction to a write.
            await self._run(self._do_execute, "BEGIN IMMEDIATE", ())
            yield self._conn

    async def _commit(self, conn: Any) -> None:
        await self._run(self._do_execute, "COMMIT", ())

    async def _rollback(self, conn: Any) -> None:
        def rollback() -> None:
            if self._c().in_transaction:
                self._c().execute("ROLLBACK")

        await self._run(rollback)

    async def _txn_execute(self, conn: Any, sql: str, params: Params) -> int:
        return int(await self._run(self._do_execute, sql, params))

    async def _txn_executemany(self, conn: Any, sql: str, seq: Iterable[Params]) -> None:
        await self._run(self._do_executemany, sql, [tuple(p) for p in seq])

    async def _txn_execute_batch(self, conn: Any, steps: Sequence[Step]) -> None:
        await self._run(self._do_batch, steps)

    async def _txn_fetchall(self, conn: Any, sql: str, params: Params) -> list[Row]:
        rows: list[Row] = await self._run(self._do_fetchall, sql, params)
        return rows

    async def close(self) -> None:
        if self._closed:
            return
        await self._close_attached()
        async with self._lock:
            if self._conn is not None:
                await self._run(self._conn.close)
            self._closed = True
        self._executor.shutdown(wait=False)


# ----------------------------------------------------------------------------- PostgreSQL


class PostgresDatabase(Database):
    """PostgreSQL through psycopg 3, with a small pool of autocommit connections."""

    engine = "postgres"

    def __init__(self, url: str, max_connections: int = 10) -> None:
        super().__init__(url)
        if max_connections < 1:
            raise DatabaseError("max_connections must be at least 1")
        self.max_connections = max_connections
        self._idle: list[Any] = []
        self._all: set[Any] = set()
        self._opening = 0
        self._cond = asyncio.Condition()

    async def _new_conn(self) -> Any:
        import psycopg

        try:
            return await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        except psycopg.Error as err:
            # from None: the driver's exception (and its traceback) would show its text unredacted.
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {_shown(self.url)}: {_driver_text(err)}; check that the "
                "server is running and the URL (postgresql://user:password@host:port/db) is right"
            ) from None

    async def _lost(self, conn: Any, err: BaseException) -> DatabaseUnavailable | None:
        """The error to raise instead of ``err`` when ``conn`` died under it (None: an ordinary SQL error)."""
        if not (conn.closed or getattr(conn, "broken", False)):
            return None
        # The server went away for one connection: the idle ones opened before are most
        # likely gone too (a restart, pg_terminate_backend of every backend); drop them now.
        async with self._cond:
            stale, self._idle = self._idle, []
            for other in stale:
                self._all.discard(other)
        for other in stale:
            await _close_quietly(other)
        return DatabaseUnavailable(f"lost the connection to PostgreSQL at {_shown(self.url)}: {_driver_text(err)}")

    @asynccontextmanager
    async def _guard(self, conn: Any) -> AsyncIterator[None]:
        """Turn a connection dying under a statement into :class:`DatabaseUnavailable`."""
        import psycopg

        try:
            yield
        except psycopg.Error as err:
            lost = await self._lost(conn, err)
            if lost is None:
                raise
            raise lost from None

    async def _acquire(self) -> Any:
        async with self._cond:
            while True:
                self._ensure_open()
                while self._idle:
                    conn = self._idle.pop()
                    if _idle_and_alive(conn):
                        return conn
                    # The server ended it while it sat idle (a restart, pg_terminate_backend):
                    # found now, not by the caller's statement failing on it.
                    self._all.discard(conn)
                    await _close_quietly(conn)
                if len(self._all) + self._opening < self.max_connections:
                    self._opening += 1
                    break
                await self._cond.wait()
        try:
            conn = await self._new_conn()
        finally:
            async with self._cond:
                self._opening -= 1
                self._cond.notify()
        self._all.add(conn)
        return conn

    async def _release(self, conn: Any) -> None:
        async with self._cond:
            if conn.closed or self._closed or conn.info.transaction_status != 0:  # 0 = IDLE
                self._all.discard(conn)
                if not conn.closed:
                    await conn.close()
            else:
                self._idle.append(conn)
            self._cond.notify()

    @asynccontextmanager
    async def _conn(self) -> AsyncIterator[Any]:
        conn = await self._acquire()
        try:
            yield conn
        finally:
            await self._release(conn)

    @staticmethod
    async def _exec(conn: Any, sql: str, params: Params) -> Any:
        if params:
            return await conn.execute(to_pyformat(sql), tuple(params))
        return await conn.execute(sql)

    async def _auto_execute(self, sql: str, params: Params) -> int:
        async with self._conn() as conn, self._guard(conn):
            cur = await self._exec(conn, sql, params)
            return int(cur.rowcount)

    async def _auto_fetchall(self, sql: str, params: Params) -> list[Row]:
        async with self._conn() as conn, self._guard(conn):
            cur = await self._exec(conn, sql, params)
            rows: list[Row] = await cur.fetchall()
            return rows

    @asynccontextmanager
    async def _begin(self) -> AsyncIterator[Any]:
        async with self._conn() as conn:
            async with self._guard(conn):
                await conn.execute("BEGIN")
            yield conn

    async def _commit(self, conn: Any) -> None:
        async with self._guard(conn):
            await conn.execute("COMMIT")

    async def _rollback(self, conn: Any) -> None:
        if not conn.closed and conn.info.transaction_status != 0:
            async with self._guard(conn):
                await conn.execute("ROLLBACK")

    async def _txn_execute(self, conn: Any, sql: str, params: Params) -> int:
        async with self._guard(conn):
            cur = await self._exec(conn, sql, params)
            return int(cur.rowcount)

    async def _txn_executemany(self, conn: Any, sql: str, seq: Iterable[Params]) -> None:
        import psycopg

        try:
            async with self._guard(conn), conn.cursor() as cur:
                await cur.executemany(to_pyformat(sql), [tuple(p) for p in seq])  # a pipeline of psycopg's own
        except psycopg.OperationalError as err:
            if not _cut_off(err):
                raise
            raise await self._cut(conn, err) from None

    async def _cut(self, conn: Any, err: BaseException) -> DatabaseUnavailable:
        """``conn`` failed under a pipeline: closed, not reused, and the error to raise.

        A connection cut under a pipeline is not always marked broken yet
        ("cannot exit pipeline mode while busy"): its state is unknown.
        """
        await conn.close()
        lost = await self._lost(conn, err)
        assert lost is not None  # closed just now: _lost always has the error for it
        return lost

    async def _txn_execute_batch(self, conn: Any, steps: Sequence[Step]) -> None:
        await self._pipeline(conn, steps)

    async def _pipeline(self, conn: Any, steps: Sequence[Step]) -> None:
        # Pipeline mode: every statement is sent before any result is awaited (one round trip).
        # Without server-side prepared statements: psycopg prepares a statement run often
        # enough, and inside one pipeline a later use can reach the server before the
        # PREPARE does ("prepared statement _pg3_N does not exist").
        import psycopg

        threshold = conn.prepare_threshold
        conn.prepare_threshold = None
        try:
            async with self._guard(conn), conn.pipeline(), conn.cursor() as cur:
                for sql, seq in steps:
                    if seq is None:
                        await cur.execute(sql)
                    else:
                        await cur.executemany(to_pyformat(sql), [tuple(p) for p in seq])
        except psycopg.OperationalError as err:
            if not _cut_off(err):
                raise
            raise await self._cut(conn, err) from None
        finally:
            if not conn.closed:
                conn.prepare_threshold = threshold

    async def _run_transaction(self, steps: Sequence[Step]) -> None:
        async with self._conn() as conn:
            try:
                await self._pipeline(conn, [("BEGIN", None), *steps, ("COMMIT", None)])
            except BaseException:
                # a failed step leaves the transaction aborted (the pipeline skipped the rest, COMMIT too)
                if not conn.closed and conn.info.transaction_status != 0:
                    try:
                        await self._rollback(conn)
                    except Exception:  # noqa: BLE001 - the first error is the one to report
                        pass
                raise

    async def _txn_fetchall(self, conn: Any, sql: str, params: Params) -> list[Row]:
        async with self._guard(conn):
            cur = await self._exec(conn, sql, params)
            rows: list[Row] = await cur.fetchall()
            return rows

    async def close(self) -> None:
        await self._close_attached()
        async with self._cond:
            self._closed = True
            conns = list(self._all)
            self._all.clear()
            self._idle.clear()
            self._cond.notify_all()
        for conn in conns:
            await conn.close()


# ----------------------------------------------------------------------------- connect


async def connect(url: str, *, max_connections: int = 10) -> Database:
    """Open a database by URL.

    ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (the
    SQLAlchemy rule: the path is whatever follows the third slash, so
    ``f"sqlite:///{abs_path}"`` works), ``sqlite:///:memory:``, or ``postgresql://user@host:port/dbname``
    (``postgres://`` accepted). ``max_connections`` bounds the PostgreSQL pool.
    """
    scheme = urlsplit(url).scheme.lower()
    if scheme == "sqlite":
        rest = url[len("sqlite://") :]
        path = rest[1:] if rest.startswith("/") else ""
        if not path:
            raise DatabaseError(f"no file in {url!r}; use sqlite:///path/file.db or sqlite:///:memory:")
        db = SqliteDatabase(url, path)
        await db._open()
        return db
    if scheme in ("postgresql", "postgres"):
        pg = PostgresDatabase(url, max_connections=max_connections)
        conn = await pg._acquire()  # fail fast on a bad URL
        await pg._release(conn)
        return pg
    raise DatabaseError(
        f"unsupported database URL {_shown(url)!r}; use sqlite:///path/file.db, sqlite:///:memory: "
        "or postgresql://user@host:port/dbname"
    )

