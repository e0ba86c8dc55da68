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
A server that accepts the connection but never answers (another service's
port, a firewall that swallows packets) is given up on after
``connect_timeout`` (10 s unless the URL's ``?connect_timeout=N`` says
otherwise), and a connect in progress ends at once when its task is
cancelled (Ctrl-C).

A SQLite file another connection or process keeps locked for longer than
the busy timeout (30 s unless the URL's ``?busy_timeout=SECONDS`` says
otherwise; ``PRAGMA busy_timeout`` changes it later for the connection) is
:class:`DatabaseUnavailable` too, naming the file, on every call and at
connect, with what was begun rolled back; any other SQLite error (a missing
table, a syntax error) stays the driver's own. ``busy_timeout`` is the only
option a ``sqlite:`` URL takes: any other, or a value that is not a number of
seconds, is a :class:`DatabaseURLError` (never ignored).

A URL that cannot name a database (a bare path, ``sqlite://file.db`` with two
slashes, an IPv6 host without its closing bracket) is a
:class:`DatabaseURLError` saying how to write it, raised before anything is
opened: :func:`check_url`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import os
import re
import select
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from .. import _checks
from ..errors import FactstreamError
from ..redaction import MASK, redact_about, redact_settings, redact_text, redact_url, url_passwords, userinfo_ends

__all__ = [
    "CONNECT_TIMEOUT", "Database", "DatabaseError", "DatabaseURLError", "DatabaseUnavailable", "Transaction",
    "check_url", "connect", "sever", "shown_url", "sqlite_options", "sqlite_path", "to_pyformat",
]

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


class DatabaseURLError(DatabaseError):
    """A URL that names no database as written (the caller's mistake: retrying cannot help)."""


#: Seconds a PostgreSQL server has to answer a connect, unless the URL's ``connect_timeout`` (or
#: PGCONNECT_TIMEOUT) says otherwise; psycopg's own default is 130 s of silence.
CONNECT_TIMEOUT = 10.0


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
        """Release what was tied to this database (see ``_on_close``), before its connections close.

        All at once: on a server that stopped answering each writer claim
        waits its unlock's timeout, and a process with several claims waited
        that long once per claim.
        """
        releases = list(self._on_close.values())
        self._on_close.clear()
        done = await asyncio.gather(*(release() for release in releases), return_exceptions=True)
        for release, result in zip(releases, done):
            # Closing goes on; report it. A release cancelled by someone else (not this close: that raises
            # here) is said too: what it held may stay held until the server ends the session.
            if isinstance(result, asyncio.CancelledError):
                logger.warning("releasing %r while closing the database was cancelled; what it held is freed "
                               "when the connection closes", release)
            elif isinstance(result, BaseException):
                logger.error("releasing %r while closing the database failed", release, exc_info=result)

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


#: The form of a PostgreSQL URL, for hints. The placeholders are in angle brackets so that the password
#: masking of messages (which masks ``user:PASSWORD@``) leaves the example readable: a plain
#: ``user:password@host`` was shown as ``user:***@host``.
_PG_URL_FORM = "postgresql://<user>:<password>@<host>:<port>/<dbname>"


def shown_url(url: str) -> str:
    """A database ``url`` as it may appear in output: its password masked, whatever characters it holds.

    A PostgreSQL URL libpq reads one way only (:func:`_libpq_password_span`)
    is shown as libpq reads it, its password alone masked: the host, port
    and database a message is about stay readable (``u:pa?ss@h/db?application_name=a@b``
    was shown as ``u:***@b``, a host libpq never connects to). Any other URL:
    :func:`~factstream.redaction.redact_url`, every reading of a password
    masked, plus the password wherever else the URL shows it (see :func:`_scrub`).
    """
    span = _libpq_password_span(url)
    if span is None:
        return _scrub(redact_url(url), url)
    start, end = span
    return url[:start] + (MASK if end > start else "") + redact_settings(url[end:])


def _libpq_password_span(url: str) -> tuple[int, int] | None:
    """Where in ``url`` the password libpq reads is, when libpq reads ``url`` one way only; None otherwise.

    libpq's reading (``conninfo_uri_parse_options`` in fe-connect.c, which
    :func:`psycopg.conninfo.conninfo_to_dict` runs): the userinfo ends at the
    first '@', unless a '/' comes first (then there is none), the password
    at the first ':' of it. "One way only": no later '@' could end a
    user name or password (:func:`_password_end`, which passes over one in
    a query's setting, ``application_name=a@b``), so no other reader may
    take more of the URL for the password. An empty span: no password.
    """
    scheme, sep, run = url.partition("://")
    if not sep or scheme.lower() not in ("postgresql", "postgres"):
        return None
    first = userinfo_ends(run)[0]
    if _password_end(run) != first:
        return None
    try:
        from psycopg.conninfo import conninfo_to_dict

        parsed = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - a URL libpq cannot parse: masked every way (redact_url)
        return None
    begin = len(scheme) + 3
    at = begin + max(first, 0)
    colon = url.find(":", begin, at)
    if colon < 0:
        return (at, at) if "password" not in parsed else None
    if parsed.get("password", "") != _percent_decoded(url[colon + 1 : at]):
        return None  # not libpq's reading after all: mask every way
    return colon + 1, at


def _percent_decoded(text: str) -> str:
    """``text`` percent-decoded as libpq decodes a URL's parts."""
    from urllib.parse import unquote

    return unquote(text)


_shown = shown_url


def _libpq_passwords(url: str) -> list[str]:
    """The password and key passphrase libpq itself reads in ``url`` (none if it cannot parse it)."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parsed = conninfo_to_dict(url)
    except Exception:  # noqa: BLE001 - a URL libpq cannot parse: the masking's readings cover it
        return []
    return [v for k, v in parsed.items() if k in ("password", "sslpassword") and isinstance(v, str)]


def _url_passwords(url: str) -> list[str]:
    """Every string ``url`` may hold as a password (longest first): the masking's readings, and libpq's own."""
    found = set(url_passwords(url)) | set(_libpq_passwords(url))
    return sorted((p for p in found if p and p != MASK), key=len, reverse=True)


def _scrub(text: str, url: str) -> str:
    """``text`` with the password of ``url`` masked wherever it appears, whatever characters it holds.

    :func:`~factstream.redaction.redact_about` (the masking's one reading of
    the URL), told libpq's reading too: a password a driver quotes back
    ('invalid percent-encoded token: "pa%zz"'), or a piece of one a URL
    parser took for a port, named in a message of ours.
    """
    span = _libpq_password_span(url)
    if span is None:
        return redact_about(text, url, also=_libpq_passwords(url))
    # libpq reads url one way only: its password is the one secret, masked wherever it stands (a longer
    # reading's pieces, masked otherwise, were the URL's host, port and database name: 'port ***').
    password = url[span[0] : span[1]]
    for secret in sorted({password, _percent_decoded(password)} - {""}, key=len, reverse=True):
        for quoted in (f'"{secret}"', f"'{secret}'"):
            text = text.replace(quoted, quoted[0] + MASK + quoted[0])
        if len(secret) >= 3:
            text = text.replace(secret, MASK)
    return redact_text(text)


def sever(conn: Any) -> None:
    """Shut a psycopg connection's socket down: whatever waits on it reads the end at once; the server is not asked.

    For a server that stopped answering: cancelling a query there makes
    psycopg send a cancel request and wait 5 s for it, then 5 s more for the
    query, with a WARNING each time. The socket is a duplicate's, so the
    driver's own descriptor is left for it to close.
    """
    import socket

    pgconn = getattr(conn, "pgconn", None)
    if pgconn is None:
        return
    try:
        fd = os.dup(pgconn.socket)
    except Exception:  # noqa: BLE001 - closed already: nothing waits on it
        return
    with socket.socket(fileno=fd) as sock:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


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


def _driver_text(err: BaseException, url: str = "") -> str:
    """A driver error's message on one line, any password in it (and ``url``'s, wherever it appears) masked."""
    text = " ".join(str(err).split()) or type(err).__name__
    return _scrub(redact_text(text), url) if url else redact_text(text)


# ----------------------------------------------------------------------------- SQLite


def _sqlite_open_problem(path: str, url: str, err: sqlite3.Error) -> str:
    """Why SQLite could not open ``path``, in words that say what to change.

    SQLite says "unable to open database file" for a directory, a missing
    folder and a folder it may not write alike.
    """
    if os.path.isdir(path):
        return (f"{path!r} is a directory, not a SQLite database file; name a file, e.g. "
                f"{url.rstrip('/')}/factstream.db")
    if getattr(err, "sqlite_errorname", "") == "SQLITE_NOTADB":
        return f"{path!r} is not a SQLite database ({err}); give the URL of a database file"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return (f"cannot create SQLite database {path!r}: its folder {folder!r} does not exist "
                "(sqlite:///relative.db, sqlite:////absolute/path.db)")
    return (f"cannot open SQLite database {path!r} ({err}); check that the file and its folder "
            f"{folder!r} are readable and writable")



def _sqlite_busy(err: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for a lock another connection holds (SQLITE_BUSY: busy_timeout ran out).

    Only SQLITE_BUSY and its extended codes: SQLITE_LOCKED ("database table
    is locked") is a conflict inside this one connection, a usage error that
    waiting cannot cure, and any other OperationalError is the statement's own.
    """
    code = getattr(err, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF == 5  # SQLITE_BUSY
    return str(err) == "database is locked"


def _waited(err: sqlite3.Error) -> str:
    """How long SQLite waited for the lock before ``err``, for a message."""
    ms = getattr(err, "factstream_busy_ms", None)
    if not isinstance(ms, int):
        return "gave up after the busy timeout"
    shown = f"{ms // 1000} s" if ms >= 1000 and ms % 1000 == 0 else f"{ms} ms"
    return f"gave up after waiting {shown}, the busy timeout"


#: How long SQLite waits for a lock another connection holds before giving up, unless the URL's
#: ``?busy_timeout=SECONDS`` says otherwise (``PRAGMA busy_timeout`` changes it later).
_BUSY_TIMEOUT_MS = 30_000

#: The longest busy timeout SQLite takes (milliseconds in a C int: about 24 days).
_MAX_BUSY_TIMEOUT_MS = 2**31 - 1

#: What a busy SQLite database left behind, per kind of call (see SqliteDatabase._run).
_NOTHING_WRITTEN = "nothing was written"
_NOT_STARTED = "the transaction did not start, nothing was written"
_TXN_ROLLS_BACK = "the transaction rolls back, nothing of it is written"
_NOT_COMMITTED = "the transaction was not committed (it rolls back), nothing of it is written"


class SqliteDatabase(Database):
    """SQLite through the stdlib driver, in one dedicated thread.

    A file another connection or process keeps locked for longer than the
    busy timeout (``busy_timeout_ms``: 30 s, or the URL's ``?busy_timeout=SECONDS``;
    later, what ``PRAGMA busy_timeout`` set) is an ordinary
    operational condition, like PostgreSQL being down: every call raises
    :class:`DatabaseUnavailable` naming the file, never the driver's bare
    "database is locked", and what it had begun is rolled back.
    """

    engine = "sqlite"

    def __init__(self, url: str, path: str, busy_timeout_ms: int = _BUSY_TIMEOUT_MS) -> None:
        super().__init__(url)
        self.path = path
        #: milliseconds SQLite waits for a lock held elsewhere, set when the connection opens
        self.busy_timeout_ms = busy_timeout_ms
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="factstream-sqlite")
        self._lock = asyncio.Lock()
        self._conn: sqlite3.Connection | None = None

    async def _open(self) -> None:
        def opener() -> sqlite3.Connection:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            try:
                conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
                if self.path != ":memory:":
                    conn.execute("PRAGMA journal_mode = WAL")
                    conn.execute("PRAGMA synchronous = NORMAL")
            except sqlite3.Error as err:
                conn.close()
                err.factstream_busy_ms = int(self.busy_timeout_ms)  # type: ignore[attr-defined]
                raise
            return conn

        try:
            self._conn = await self._submit(opener)
        except sqlite3.Error as err:
            self._executor.shutdown(wait=False)
            self._closed = True
            if _sqlite_busy(err):
                raise DatabaseUnavailable(
                    f"cannot open the SQLite database {self.path!r}: it is locked by another connection or process "
                    f"({err}; {_waited(err)}); nothing was written; retry once it is released"
                ) from None
            raise DatabaseError(_sqlite_open_problem(self.path, self.url, err)) from err

    def _submit(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        self._ensure_open()
        return asyncio.get_running_loop().run_in_executor(self._executor, self._in_thread, fn, args)

    def _in_thread(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``fn(*args)``; a busy error takes along the busy timeout it waited (read now: the thread is free)."""
        try:
            return fn(*args)
        except sqlite3.OperationalError as err:
            if self._conn is not None and _sqlite_busy(err):
                try:
                    ms = int(self._conn.execute("PRAGMA busy_timeout").fetchone()[0])
                except sqlite3.Error:
                    ms = None
                err.factstream_busy_ms = ms  # type: ignore[attr-defined]
            raise

    async def _run(self, fn: Callable[..., Any], *args: Any, outcome: str = _TXN_ROLLS_BACK) -> Any:
        """``fn(*args)`` in the database thread (see :meth:`_busy_is_unavailable` for ``outcome``)."""
        return await self._busy_is_unavailable(self._submit(fn, *args), outcome)

    async def _busy_is_unavailable(self, job: Awaitable[Any], outcome: str) -> Any:
        """The result of ``job``; SQLite giving up on a lock held elsewhere is :class:`DatabaseUnavailable`.

        ``outcome`` says what became of the work then; the default of
        :meth:`_run` is for a statement inside an open transaction (which the
        error rolls back).
        """
        try:
            return await job
        except sqlite3.OperationalError as err:
            if not _sqlite_busy(err):
                raise  # a real SQL error stays the driver's own
            # from None: the driver's "database is locked" and its traceback add nothing to this message
            raise DatabaseUnavailable(
                f"the SQLite database {self.path!r} is locked by another connection or process ({err}; "
                f"{_waited(err)}); {outcome}; retry once it is released"
            ) from None

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
        return await self._busy_is_unavailable(done, _NOTHING_WRITTEN)

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
            await self._run(self._do_execute, "BEGIN IMMEDIATE", (), outcome=_NOT_STARTED)
            yield self._conn

    async def _commit(self, conn: Any) -> None:
        await self._run(self._do_execute, "COMMIT", (), outcome=_NOT_COMMITTED)

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

    def __init__(self, url: str, max_connections: int = 10, connect_timeout: float = CONNECT_TIMEOUT) -> None:
        super().__init__(url)
        if max_connections < 1:
            raise DatabaseError("max_connections must be at least 1")
        self.max_connections = max_connections
        self.connect_timeout = _checks.seconds("connect_timeout", connect_timeout)
        self._idle: list[Any] = []
        self._all: set[Any] = set()
        self._opening = 0
        self._cond = asyncio.Condition()

    def _timeout_args(self) -> dict[str, Any]:
        """psycopg's ``connect_timeout``, unless the URL or PGCONNECT_TIMEOUT sets one (libpq: whole seconds)."""
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = "connect_timeout" in conninfo_to_dict(self.url)
        except Exception:  # noqa: BLE001 - a URL libpq cannot parse: connect() below says why
            given = False
        if given or os.environ.get("PGCONNECT_TIMEOUT"):
            return {}
        return {"connect_timeout": max(1, math.ceil(self.connect_timeout))}

    def _timeout_shown(self, args: dict[str, Any]) -> str:
        """The connect timeout psycopg applied, for a message ("10 s")."""
        from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo

        try:
            return f"{timeout_from_conninfo(conninfo_to_dict(self.url, **args))} s"
        except Exception:  # noqa: BLE001 - only for the message
            return "the connect timeout"

    async def _new_conn(self) -> Any:
        import psycopg

        args = self._timeout_args()
        try:
            return await psycopg.AsyncConnection.connect(self.url, autocommit=True, **args)
        except psycopg.errors.ConnectionTimeout:
            # Accepted, then silence: another service's port (Redis's 6379), or a firewall dropping packets.
            raise DatabaseUnavailable(
                f"no PostgreSQL answered at {_shown(self.url)} within {self._timeout_shown(args)}: is that "
                "PostgreSQL's port? (a slow server: add ?connect_timeout=SECONDS to the URL)"
            ) from None
        except psycopg.Error as err:
            # from None: the driver's exception (and its traceback) would show its text unredacted.
            raise DatabaseUnavailable(
                f"cannot connect to PostgreSQL at {_shown(self.url)}: {_driver_text(err, self.url)}; check that "
                f"the server is running and the URL ({_PG_URL_FORM}) is right"
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
        return DatabaseUnavailable(
            f"lost the connection to PostgreSQL at {_shown(self.url)}: {_driver_text(err, self.url)}"
        )

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


async def connect(url: str, *, max_connections: int = 10, connect_timeout: float = CONNECT_TIMEOUT) -> Database:
    """Open a database by URL.

    ``sqlite:///relative/path.db`` or ``sqlite:////absolute/path.db`` (the
    SQLAlchemy rule: the path is whatever follows the third slash, up to a
    ``?``, so ``f"sqlite:///{abs_path}"`` works), ``sqlite:///:memory:``, or
    ``postgresql://user@host:port/dbname`` (``postgres://`` accepted). A
    SQLite URL may end in ``?busy_timeout=SECONDS``: how long a statement (and
    the connect) waits for a lock another connection or process holds before
    :class:`DatabaseUnavailable` (default 30; fractions and 0 allowed).
    ``max_connections`` bounds the PostgreSQL pool; ``connect_timeout``
    is how long a PostgreSQL server has to answer each connect (the URL's ``?connect_timeout=N`` wins).
    A URL that names no database, or gives a SQLite option that does not exist or a value it cannot
    mean, is a :class:`DatabaseURLError` (see :func:`check_url`).
    """
    if check_url(url) == "sqlite":
        busy = sqlite_options(url).get("busy_timeout")
        busy_ms = _BUSY_TIMEOUT_MS if busy is None else round(busy * 1000)
        db = SqliteDatabase(url, sqlite_path(url), busy_timeout_ms=busy_ms)
        await db._open()
        return db
    pg = PostgresDatabase(url, max_connections=max_connections, connect_timeout=connect_timeout)
    conn = await pg._acquire()  # fail fast on a bad URL
    await pg._release(conn)
    return pg


_URL_FORMS = "sqlite:///path/file.db, sqlite:///:memory: or postgresql://user@host:port/dbname"


def check_url(url: str) -> str:
    """The engine ``url`` names, ``"sqlite"`` or ``"postgres"``; :class:`DatabaseURLError` saying how to write it.

    Checked before anything is opened, so that a path typed without its
    scheme, ``sqlite://file.db`` (two slashes: no path) or a host missing
    its ``]`` is named as such, not as "no database at 'sqlite://file.db'"
    or a bare "Invalid IPv6 URL".
    """
    if "://" not in url and not url.lower().startswith("sqlite:"):
        raise DatabaseURLError(_no_scheme(url))
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        sqlite_path(url)
        sqlite_options(url)
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        _check_postgres_host(url)
        return "postgres"
    raise DatabaseURLError(f"unsupported database URL {_shown(url)!r}; use {_URL_FORMS}")


def _no_scheme(url: str) -> str:
    """What to write instead of a URL without a scheme: a file path, or libpq's key=value form."""
    if "=" in url:
        return f"{_shown(url)!r} is a key=value connection string; write it as a URL: {_PG_URL_FORM}"
    if not url:
        return f"empty database URL; use {_URL_FORMS}"
    if _shown(url) != url:  # user:password@host typed without its scheme: not a file, and its password is masked
        return f"{_shown(url)!r} is not a database URL: it needs its scheme; use {_URL_FORMS}"
    return f"{url!r} is a file path, not a database URL; write sqlite:///{url}"


def sqlite_path(url: str) -> str:
    """The file (or ``:memory:``) a ``sqlite:`` URL names; :class:`DatabaseURLError` if it names none.

    The path is what follows the third slash, up to the options (``?``):
    ``sqlite://t.db`` has none (``t.db`` is where a URL's host goes), so it is
    refused with the form that names ``t.db``, not read as a file name that
    does not exist.
    """
    rest = url[len("sqlite:") :].partition("?")[0]
    if rest.startswith("///"):
        path = rest[3:]
        if path:
            return path
    typed = rest.lstrip("/")
    if not typed:
        raise DatabaseURLError(f"no file in {url!r}; use sqlite:///path/file.db or sqlite:///:memory:")
    raise DatabaseURLError(f"{url!r} names no file (the path follows a third slash); write sqlite:///{typed}")


#: The options a ``sqlite:`` URL takes, for messages.
_SQLITE_OPTIONS = ("busy_timeout=SECONDS (how long to wait for a lock another connection or process holds, "
                   "default 30)")


def sqlite_options(url: str) -> dict[str, float]:
    """The options after ``?`` in a ``sqlite:`` URL, checked: ``{"busy_timeout": seconds}`` when given.

    ``busy_timeout`` is the only one, in seconds (fractions and 0 allowed);
    an option of any other name, one given twice, or a value that is not a
    number of seconds is a :class:`DatabaseURLError` naming it, never ignored
    (a typo such as ``busytimeout=5`` would otherwise leave the default
    30 s in force without a word).
    """
    query = url.partition("?")[2]
    found: dict[str, float] = {}
    for part in query.split("&"):
        if not part:
            continue
        name, eq, value = part.partition("=")
        if name != "busy_timeout":
            raise DatabaseURLError(
                f"unknown option {name!r} in {url!r}: a sqlite: URL takes only {_SQLITE_OPTIONS}, "
                "e.g. sqlite:///path/file.db?busy_timeout=5"
            )
        if name in found:
            raise DatabaseURLError(f"{name} is given twice in {url!r}; give it once")
        try:
            secs = float(value) if eq else math.nan
        except ValueError:
            secs = math.nan
        if not (math.isfinite(secs) and 0 <= secs * 1000 <= _MAX_BUSY_TIMEOUT_MS):
            raise DatabaseURLError(
                f"{name} in {url!r} must be a number of seconds from 0 to {_MAX_BUSY_TIMEOUT_MS // 1000}, "
                f"got {value!r}" + ("" if eq else f" (write {name}=SECONDS)")
            )
        found[name] = secs
    return found


def _check_postgres_host(url: str) -> None:
    """A malformed host or port of a PostgreSQL URL, named (password masked) before libpq reads it.

    Where the hosts begin is read both ways of
    :func:`~factstream.redaction.userinfo_ends`: libpq's (after the first '@'
    before any '/': its password may hold '?', '#' or ':') and after the last
    '@' before the query (a password holding '@' or '/'). Only a fault both
    readings find is reported, and always from the hosts after the last '@',
    which no password precedes. A password cut short by an unencoded '/' or
    '@' (:func:`_cut_password`) is named as such first: read as a host and
    port, its first part made a message about a port ("the port in 'u:s3'").
    """
    run = url.split("://", 1)[1] if "://" in url else ""
    first, last, _ = userinfo_ends(run)
    # An '@' in libpq's hosts (libpq ends the userinfo at the first '@': the rest of the password would be taken
    # for the host), or a '/' or '@' that cuts the user name or password another way: one wording for all.
    if (0 <= first < last and "/" not in run[first:last]) or _cut_password(run):
        raise DatabaseURLError(f"the user name or password in {_shown(url)} {_CUT_PASSWORD}")
    faults = []
    for at in (first, last):
        hosts = re.split(r"[/?#]", run[at + 1 :], maxsplit=1)[0]
        fault = next(filter(None, (_host_fault(h) for h in hosts.split(",") if h)), None)  # host1:5432,host2
        if fault is None:
            break
        faults.append(fault)
    else:
        raise DatabaseURLError(_scrub(f"bad host or port in {_shown(url)}: {faults[-1]}", url))
    _check_libpq_reads(url)


def _check_libpq_reads(url: str) -> None:
    """A PostgreSQL URL libpq itself cannot read, refused in its words (password masked) with what to write.

    Before, ``postgresql://u@h?x`` (no '=' in the query), a space or a '%'
    not followed by two hex digits in a part, or a query setting libpq does
    not know passed here and failed at the connect: exit 1, "check that the
    server is running".
    """
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # pragma: no cover - psycopg is a dependency; the connect would say it is missing
        return
    try:
        conninfo_to_dict(url)
    except Exception as err:  # noqa: BLE001 - psycopg.ProgrammingError: libpq's parser said no
        said = " ".join(str(err).split()).rstrip(".")
        raise DatabaseURLError(_scrub(
            f"libpq cannot read {_shown(url)} ({said}): write it as {_PG_URL_FORM}?<setting>=<value>&..., "
            "with a '%' or a space in any part percent-encoded (%25, %20)", url)) from None


#: How to write a password holding characters that end it in a URL (all named: which it holds is not said).
_ENCODE_PASSWORD = "percent-encode '/', '?' and '#' in the password (%2F, %3F, %23), and '@' as %40"
#: The one wording for a user name or password an unencoded '/' or '@' cuts short (what follows "... in URL").
_CUT_PASSWORD = (
    f"holds a character that ends it early: {_ENCODE_PASSWORD} (libpq ends it at its first '/' or '@' and reads "
    "the rest as host, port and database name; an '@' that belongs to the database name is written %40 too)"
)

# One host of a URL (a name, an IPv4 or a bracketed IPv6 address, or a %-encoded socket directory), its port.
_ONE_HOST = r"(?:[A-Za-z0-9._~%\-]+|\[[0-9A-Fa-f:.]+\])(?::\d*)?"
# What follows the '@' that ends a userinfo: a host list (perhaps empty: a Unix socket), then the authority's end.
_HOSTS_THEN_END = re.compile(rf"(?:{_ONE_HOST}(?:,{_ONE_HOST})*)?(?=[/?#]|$)")
# A key=value setting of a query, up to its value (application_name=a@b).
_SETTING_KEY = re.compile(r"[A-Za-z0-9_.%+\-]+=")


def _valid_hosts(hosts: str) -> bool:
    """Whether ``hosts`` is a host list libpq can use: ``h1:5432,[::1]``, or empty (a Unix socket)."""
    return not re.search(r"[@#?/]", hosts) and not any(_host_fault(h) for h in hosts.split(",") if h)


def _password_end(run: str) -> int:
    """Where the user name and password of ``run`` (a URL after ``scheme://``) end as written: an '@' (-1: none).

    The last '@' followed by a host list and the authority's end, whatever
    '/', '?', '#' or '@' the password holds before it. One in a
    query's ``key=value`` setting (``?application_name=a@b``) ends no password
    when another '@' may, or when what a URL parser reads as the hosts
    (before the first '/', '?' or '#') is a valid host list.
    """
    netloc = re.split(r"[/?#]", run, maxsplit=1)[0]
    ats = [i for i, ch in enumerate(run) if ch == "@" and _HOSTS_THEN_END.match(run, i + 1)]
    for at in reversed(ats):
        start = max(run.rfind(c, 0, at) for c in "?#&") + 1
        in_setting = start > 0 and _SETTING_KEY.match(run, start) is not None and "=" in run[start:at]
        if in_setting and (at != ats[0] or _valid_hosts(netloc)):
            continue
        return at
    return -1


def _cut_password(run: str) -> bool:
    """Whether the user name or password of ``run`` (a URL after ``scheme://``) holds a '/' or '@' libpq ends it at.

    libpq ends the user name and password at the first '@' unless a '/'
    comes first: a '/' in the password leaves no password at all (what
    precedes it is read as host and port, the rest as the database name and
    query), an '@' leaves its first part (the rest read as the host). A '?'
    or '#' alone is no cut: libpq reads such a password whole. Refused too:
    a password, then a database name holding an '@' that a host follows
    (``postgresql://u:pw@h/db@x``; see the comment below). Not refused: no
    password, then such a database name (``postgresql://u@h:5432/db@x``;
    ``postgresql://u:1234/5678@h``, host u and port 1234 to libpq, reads the
    same way and cannot be told from it). A user name without a password
    is cut only where libpq's hosts then hold an '@' (``u@x@h/db@y``):
    ``host/a@b`` and ``u/x@h`` read as host and database name.
    """
    at = _password_end(run)
    info = run[:at] if at >= 0 else ""
    if not ("/" in info or "@" in info):
        return False
    first = userinfo_ends(run)[0]
    if 0 <= first < at and ":" in run[:first]:
        # libpq reads a password, then a database name holding '@' (u:pw@h/db@x, u:pw@h/a@b/c): a valid URL to
        # libpq, refused all the same. It is written alike as the common mistake, a password holding '@' and
        # '/' (u:Kq7@Wx4/Zp9@127.0.0.1/db), where libpq would look up a piece of the password as a host name and
        # a message would show the rest; and no output could show the hosts libpq uses and be sure to hide that
        # password. Written with %40 for the database name's '@' (or the password's), both read one way.
        return True
    begin = first + 1  # libpq's hosts: after its userinfo, up to the path or the query ('#' is no end to it)
    stop = min((i for i in (run.find("/", begin), run.find("?", begin)) if i >= 0), default=len(run))
    if ":" not in info:  # no password: a host holds no '@', so one there is the rest of the user name
        return "@" in run[begin:stop]
    after = _HOSTS_THEN_END.match(run, at + 1)
    in_path = stop < at and run[stop] == "/" and "?" not in run[stop:at]
    ends_there = after is not None and run[after.end() : after.end() + 1] in ("", "?")
    return not (in_path and ends_there and _valid_hosts(run[begin:stop]))


def _host_fault(host: str) -> str | None:
    """What is wrong with one ``host[:port]`` of a PostgreSQL URL, or None."""
    brackets = "an IPv6 address goes in brackets: postgresql://user@[::1]:5432/dbname"
    if host.startswith("["):
        addr, close, after = host[1:].partition("]")
        if not close:
            return f"{host!r} opens '[' without its closing ']' ({brackets})"
        if ":" not in addr:
            return f"{host!r}: brackets hold an IPv6 address, got {addr!r}"
        port = after[1:] if after.startswith(":") else None
        if after and port is None:
            return f"{host!r}: after ']' comes ':PORT' or nothing, got {after!r}"
    elif "]" in host:
        return f"{host!r} closes ']' without its opening '[' ({brackets})"
    elif host.count(":") > 1:
        return f"{host!r} looks like an IPv6 address without its brackets: postgresql://user@[{host}]/dbname"
    else:
        port = host.partition(":")[2] if ":" in host else None
    if port and not (port.isdigit() and int(port) <= 65535):
        return f"the port in {host!r} must be a number 0-65535, got {port!r}"
    return None
