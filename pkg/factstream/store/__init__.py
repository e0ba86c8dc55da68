"""Database access for SQLite and PostgreSQL behind one small interface.

``database`` opens connections (:func:`factstream.store.database.connect`),
``migrations`` creates and upgrades the schema of each component.
"""

from __future__ import annotations

from .database import Database, DatabaseError, Transaction, connect

__all__ = ["Database", "DatabaseError", "Transaction", "connect"]
