"""One process per writer name and database: a second ``master`` is refused, not run beside the first.

Two processes writing as the same instance share its id blocks and its
position rows, and each publishes the other's ids as its own: a reader then
skips rows or waits on ids nobody completes. Synapse relies on its
configuration for this; a tool started by hand twice should say so instead.

The claim lives exactly as long as the process: SQLite by an exclusive
``flock`` on a file beside the database (``DB-writer-NAME.lock``; the kernel
drops it when the process dies, however it dies); PostgreSQL by a session
advisory lock on a connection of the claim's own (dropped with the session).
A PostgreSQL claim whose connection is lost is made again when the
connection comes back; if another process claimed the name meanwhile, that
is logged as an error. Closing the database releases the claims made on it
(its writer is done), so nothing is left open behind it.

An instance name goes into the lock file's name, so one that is not a plain
file name component (``/``, ``\\``, ``..``, control characters) is refused
on both engines, rather than pointing the lock elsewhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

from .._checks import text
from .database import Database, DatabaseError, DatabaseUnavailable, PostgresDatabase, sever

__all__ = ["WriterTaken", "WriterClaim", "claim_writer"]

log = logging.getLogger(__name__)

#: Seconds between checks that a PostgreSQL claim's connection is still up.
RECHECK = 5.0
#: Seconds release() waits for PostgreSQL to unlock the name before it just closes the connection.
UNLOCK_TIMEOUT = 5.0


class WriterTaken(DatabaseError):
    """Another running process already writes as this instance name to this database."""


def _lock_key(instance_name: str) -> int:
    """A signed 64-bit advisory lock key for the name (the same in every process)."""
    digest = hashlib.blake2b(f"factstream writer {instance_name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _check_name(instance_name: object) -> str:
    """The instance name, if it can be part of a lock file's name (the same rule on both engines)."""
    name = text("instance_name", instance_name)
    if any(c in "/\\" or ord(c) < 32 or ord(c) == 127 for c in name) or ".." in name:
        raise ValueError(
            f"instance_name {name!r} cannot name a writer: it becomes part of a lock file's name, so "
            "leave out '/', '\\', '..' and control characters"
        )
    return name


def _taken(instance_name: str, where: str) -> WriterTaken:
    return WriterTaken(
        f"another process is already writing as {instance_name!r} to {where}: stop it first, or give this "
        "one another --instance-name (each writer of a database needs its own)"
    )


class WriterClaim:
    """The claim on a writer name; :meth:`release` gives it up (closing the database or the process does too)."""

    def __init__(self, db: Database, instance_name: str) -> None:
        if not isinstance(db, Database):
            raise TypeError(
                f"claim_writer() takes the Database from connect(), not a {type(db).__name__}: "
                "db = await connect(url); claim = await claim_writer(db, name)"
            )
        self.db = db
        self.instance_name = _check_name(instance_name)
        self._fd: int | None = None
        self._conn: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def _claim(self) -> None:
        self.db._ensure_open()  # noqa: SLF001 - a claim on a closed database would outlive it
        if self.db.engine == "sqlite":
            self._claim_file()
        else:
            self._conn = await self._claim_session()
            if self.db.closed:  # closed while the claim was being made
                await self.release()
                self.db._ensure_open()  # noqa: SLF001 - raises
            self._watch = asyncio.get_running_loop().create_task(self._keep())
        self.db._on_close[id(self)] = self.release  # noqa: SLF001

    def _claim_file(self) -> None:
        import fcntl

        path = getattr(self.db, "path", ":memory:")
        if path == ":memory:":
            return  # a private database: nobody else can write to it
        lock = f"{path}-writer-{self.instance_name}.lock"
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise DatabaseError(
                f"cannot create the writer lock file {lock!r} ({err.strerror}); check that the database's "
                "folder is writable, or use a shorter instance name"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise _taken(self.instance_name, path) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # for a person looking: who holds it
        self._fd = fd

    async def _claim_session(self) -> Any:
        assert isinstance(self.db, PostgresDatabase)
        conn = await self.db._new_conn()  # noqa: SLF001 - a connection outside the pool, kept for the claim
        try:
            cur = await conn.execute("SELECT pg_try_advisory_lock(%s)", (_lock_key(self.instance_name),))
            row = await cur.fetchone()
        except Exception:
            await conn.close()
            raise
        if not row or not row[0]:
            await conn.close()
            raise _taken(self.instance_name, "this PostgreSQL database")
        return conn

    async def _keep(self) -> None:
        while True:
            await asyncio.sleep(RECHECK)
            conn = self._conn
            alive = conn is not None and not conn.closed and not getattr(conn, "broken", False)
            if alive:
                try:
                    await conn.execute("SELECT 1")
                    continue
                except Exception:  # noqa: BLE001 - any failure: the session (and the lock) may be gone
                    pass
            try:
                if conn is not None:
                    await conn.close()
                self._conn = await self._claim_session()
                log.warning("writer %r: the connection holding its claim was lost; claimed again",
                            self.instance_name)
            except WriterTaken as err:
                self._conn = None
                log.error("writer %r: lost its claim while the database was unreachable, and %s",
                          self.instance_name, err)
            except DatabaseUnavailable:
                self._conn = None  # tried again at the next check

    async def _unlock(self, conn: Any) -> None:
        """Free the name before the connection closes: closing only asks the server to end the session, which
        drops the lock some time after close() returns (a claim made just after could still be refused)."""
        if conn.closed or getattr(conn, "broken", False):
            return  # the session is gone or going: so is its lock
        unlock = asyncio.ensure_future(conn.execute("SELECT pg_advisory_unlock(%s)", (_lock_key(self.instance_name),)))
        try:
            await asyncio.wait({unlock}, timeout=UNLOCK_TIMEOUT)
        finally:
            if not unlock.done():
                # A server that stopped answering: its lock goes when it ends the session. Cut the socket rather
                # than cancel the query (psycopg's cancel waits 5 s + 5 s on a silent server, warning twice).
                sever(conn)
                await asyncio.wait({unlock}, timeout=1.0)
                if not unlock.done():
                    unlock.cancel()
            if unlock.done() and not unlock.cancelled():
                unlock.exception()  # retrieved: a failed unlock is the session ending, said nowhere

    async def release(self) -> None:
        """Give the claim up (idempotent; closing the database does it too)."""
        self.db._on_close.pop(id(self), None)  # noqa: SLF001
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
            self._watch = None
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                await self._unlock(conn)
            finally:  # closed even if this release is cancelled meanwhile
                try:
                    await conn.close()
                except Exception:  # noqa: BLE001 - closing a dead connection may fail any way
                    pass
        if self._fd is not None:
            os.close(self._fd)  # the flock goes with it; the file stays (removing it would race a new claimer)
            self._fd = None


async def claim_writer(db: Database, instance_name: str) -> WriterClaim:
    """Claim ``instance_name`` on ``db`` for this process; :class:`WriterTaken` when another holds it.

    ``db`` is the open :class:`Database` from ``connect()``. The claim lasts
    until :meth:`WriterClaim.release`, ``db.close()`` or the end of the process.
    """
    claim = WriterClaim(db, instance_name)
    await claim._claim()  # noqa: SLF001
    return claim
