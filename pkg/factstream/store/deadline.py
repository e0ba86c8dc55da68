"""Deadlines on database work: give up on a database that has not answered, and end cleanly (``--db-timeout``).

A query waits as long as the server lets it: behind a lock (Synapse's schema
migrations take ACCESS EXCLUSIVE ones), or on a server that stopped answering
after the connect (a frozen host, a network path that drops packets), for
ever, and the command with it. ``positions``, ``synapse check`` and ``tail
--db`` run their database work through :func:`within` (async drivers) or
:func:`within_thread` (blocking ones). Past the deadline each busy connection
is asked to cancel its query (a lock wait ends at once and leaves nothing
behind); a connection whose server does not answer that within
:data:`CANCEL_WAIT` is cut (its socket shut down), so that the command ends
about a second after the deadline, with one line naming the database.
``synapse watch`` runs each probe through :func:`within_thread_async` (a
blocking driver, awaited on an event loop that goes on meanwhile).

Why not cancel the asyncio task and let psycopg clean up: psycopg answers a
cancelled task by sending PostgreSQL a cancel request and giving it 5 s, then
giving the query 5 s more to end, logging a WARNING each time it waits in
vain. On a silent server that is 10 s past the deadline and two warnings (a
second cancel cuts it short, with a warning still). Its cancel is only
skipped for a connection that is not running a query, so the query is
cancelled here, with a shorter wait, before the task is touched.

The code that opens connections under a deadline calls :func:`watch` on them
(a psycopg connection, a sqlite3 one, or a factstream ``Database``); outside
a deadline :func:`watch` does nothing.
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from ..errors import FactstreamError
from ..redaction import redact_url
from .database import sever

__all__ = ["CANCEL_WAIT", "DEFAULT", "NoAnswer", "QueriesWithin", "bounded_url", "watch",
           "within", "within_thread", "within_thread_async"]

T = TypeVar("T")

#: Seconds a command waits for its database by default.
DEFAULT = 60.0
#: Seconds a server gets to answer a cancel request (and its query to end) before the connection is cut.
CANCEL_WAIT = 1.0


class NoAnswer(FactstreamError):
    """The database did not answer within --db-timeout (its work was cancelled or cut)."""


def bounded_url(url: str, after: float) -> str:
    """``url`` to connect with: a SQLite one waits for a lock at most ``after`` seconds (its ``busy_timeout``).

    SQLite's busy wait runs in the driver's thread and nothing interrupts it
    (``sqlite3.Connection.interrupt`` does not), so a command that gave up at
    the deadline still ended only when the busy timeout (30 s) ran out. A
    shorter ``?busy_timeout=`` in the URL stays.
    """
    from .database import check_url, sqlite_options

    if check_url(url) != "sqlite":
        return url
    given = sqlite_options(url).get("busy_timeout")
    busy = after if given is None else min(given, after)
    return f"{url.partition('?')[0]}?busy_timeout={busy:g}"


def no_answer(url: str, after: float) -> NoAnswer:
    """The error saying the database at ``url`` did not answer within ``after`` seconds (password masked)."""
    return NoAnswer(f"{redact_url(url)} did not answer within {after:g} s (a table locked by a migration? a server "
                    "that stopped answering?); --db-timeout SECONDS to wait longer")


class _Watched:
    """The connections opened under one deadline."""

    def __init__(self, things: Iterable[Any] = ()) -> None:
        self.things: list[Any] = list(things)

    def connections(self) -> list[Any]:
        """Every driver connection now open: a factstream PostgreSQL database stands for its pooled ones."""
        out: list[Any] = []
        for thing in self.things:
            pooled = getattr(thing, "_all", None)  # store.database.PostgresDatabase keeps its connections there
            out.extend(list(pooled) if isinstance(pooled, set) else [thing])
        return out


_WATCHED: contextvars.ContextVar[_Watched | None] = contextvars.ContextVar("factstream_db_deadline", default=None)


def watch(connection: Any) -> None:
    """Let the deadline this runs under cancel or cut ``connection`` (no deadline: nothing)."""
    watched = _WATCHED.get()
    if watched is not None:
        watched.things.append(connection)


def _busy(conn: Any) -> bool:
    """Whether ``conn`` is running something a cancel could stop (a psycopg query; any sqlite3 connection)."""
    if isinstance(conn, sqlite3.Connection):
        return True
    pgconn = getattr(conn, "pgconn", None)
    try:
        return pgconn is not None and int(pgconn.transaction_status) == 1  # libpq's PQTRANS_ACTIVE
    except Exception:  # noqa: BLE001 - a connection closed meanwhile
        return False


async def _cancel(conn: Any) -> bool:
    """Ask the server to cancel ``conn``'s query; whether it took the request within CANCEL_WAIT."""
    if isinstance(conn, sqlite3.Connection):
        conn.interrupt()
        return True
    try:
        await asyncio.wait_for(conn.cancel_safe(timeout=CANCEL_WAIT), CANCEL_WAIT + 0.5)
    except Exception:  # noqa: BLE001 - CancellationTimeout (a silent server), or the connection already gone
        return False
    return True


def _cancel_blocking(conn: Any) -> bool:
    """:func:`_cancel` for a blocking connection (psycopg's cancel is meant to be sent from another thread)."""
    if isinstance(conn, sqlite3.Connection):
        conn.interrupt()
        return True
    try:
        conn.cancel_safe(timeout=CANCEL_WAIT)
    except Exception:  # noqa: BLE001 - as in _cancel
        return False
    return True


async def _give_up(task: asyncio.Future[Any], watched: _Watched) -> None:
    """End ``task`` within about 2 x CANCEL_WAIT: cancel its queries, cut what does not answer, then cancel it."""
    busy = [c for c in watched.connections() if _busy(c)]
    if busy:
        answered = await asyncio.gather(*(_cancel(c) for c in busy))
        if all(answered):
            await asyncio.wait({task}, timeout=CANCEL_WAIT)
        if not task.done():
            for c in busy:
                if _busy(c):
                    sever(c)
            await asyncio.wait({task}, timeout=CANCEL_WAIT)
    if not task.done():  # no query under way (a connect, a wait for the pool): a cancelled task ends at once then
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_WAIT)
    if task.done() and not task.cancelled():
        task.exception()  # what it ended with is the deadline's doing: retrieved, never logged


async def within(read: Awaitable[T], after: float, url: str, *, watching: Iterable[Any] = ()) -> T:
    """``read``'s result, or :class:`NoAnswer` once the database at ``url`` has not answered within ``after`` s.

    Connections in ``watching``, and those ``read`` passes to :func:`watch`,
    are cancelled (then cut) at the deadline; so they are when this is
    cancelled (Ctrl-C), before the cancellation goes on.
    """
    watched = _Watched(watching)
    token = _WATCHED.set(watched)
    try:
        task = asyncio.ensure_future(read)  # the task runs in a copy of this context: watch() finds `watched`
    finally:
        _WATCHED.reset(token)
    try:
        done, _ = await asyncio.wait({task}, timeout=after)
    except asyncio.CancelledError:
        await _give_up(task, watched)
        raise
    if task in done:
        return task.result()
    await _give_up(task, watched)
    raise no_answer(url, after)


def within_thread(read: Callable[[], T], after: float, url: str, *, watching: Iterable[Any] = ()) -> T:
    """:func:`within` for a blocking ``read`` (run in a thread of its own, the caller waiting)."""
    watched = _Watched(watching)
    context = contextvars.copy_context()
    context.run(_WATCHED.set, watched)
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["value"] = context.run(read)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = err

    worker = threading.Thread(target=work, name="factstream-db-read", daemon=True)
    worker.start()
    try:
        worker.join(after)
    except KeyboardInterrupt:
        _give_up_thread(worker, watched)
        raise
    if worker.is_alive():
        _give_up_thread(worker, watched)
        raise no_answer(url, after)
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


def _give_up_thread(worker: threading.Thread, watched: _Watched) -> None:
    """:func:`_give_up` for a read in ``worker``; one that still does not end is left behind (a daemon thread)."""
    busy = [c for c in watched.connections() if _busy(c)]
    if not busy:
        return  # a connect under way: it ends by its own connect_timeout, and nothing waits for the thread
    if all([_cancel_blocking(c) for c in busy]):
        worker.join(CANCEL_WAIT)
    if worker.is_alive():
        for c in busy:
            if _busy(c):
                sever(c)
        worker.join(CANCEL_WAIT)


async def within_thread_async(read: Callable[[], T], after: float, url: str, *,
                              watching: Iterable[Any] = ()) -> T:
    """:func:`within_thread` awaited on an event loop, which goes on meanwhile (a watch keeps reading its wire).

    ``read`` runs in a daemon thread of its own rather than the loop's
    executor: a read given up on that still does not end (a connect to a host
    that does not answer waits for its ``connect_timeout``, and nothing
    interrupts a connect) then holds neither the loop's shutdown nor the exit.
    The give-up (cancel, then cut) runs in a thread too, so it does not hold
    the loop either; it also runs when this is cancelled (Ctrl-C), before the
    cancellation goes on.
    """
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()
    watched = _Watched(watching)
    context = contextvars.copy_context()
    context.run(_WATCHED.set, watched)
    outcome: dict[str, Any] = {}

    def settle() -> None:
        if not ended.done():
            ended.set_result(None)

    def work() -> None:
        try:
            outcome["value"] = context.run(read)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting task
            outcome["error"] = err
        try:
            loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    worker = threading.Thread(target=work, name="factstream-db-read", daemon=True)
    worker.start()
    try:
        await asyncio.wait({ended}, timeout=after)
    except asyncio.CancelledError:
        await asyncio.to_thread(_give_up_thread, worker, watched)
        raise
    if not ended.done():
        await asyncio.to_thread(_give_up_thread, worker, watched)
        raise no_answer(url, after)
    if "error" in outcome:
        raise outcome["error"]
    value: T = outcome["value"]
    return value


class QueriesWithin:
    """A factstream ``Database`` whose every read gives up after ``after`` seconds (:func:`within` each).

    For a reader that runs until stopped (``tail --db``): the command as a
    whole has no deadline, each query has one, and its caller decides what a
    query that did not answer means (the follower warns and tries again).
    """

    def __init__(self, db: Any, after: float, url: str) -> None:
        self._db = db
        self._after = after
        self._url = url

    async def fetchall(self, sql: str, params: Any = ()) -> list[Any]:
        """The database's ``fetchall``, within the deadline."""
        rows: list[Any] = await within(self._db.fetchall(sql, params), self._after, self._url, watching=[self._db])
        return rows

    async def fetchone(self, sql: str, params: Any = ()) -> Any:
        """The database's ``fetchone``, within the deadline."""
        return await within(self._db.fetchone(sql, params), self._after, self._url, watching=[self._db])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)
