"""Multi-writer stream tokens: "the linear position plus the writers that are ahead".

String form (Synapse-compatible): a bare position ``42`` when no writer is
ahead, else ``m{min}~{id}.{pos}~{id}.{pos}...`` where ``id`` is a writer's
compact numeric id from the ``instance_map`` table (or any explicit map) and
``pos`` its position, which is always greater than ``min``. ``s42`` is accepted
on input as a bare position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Union

from ..store.database import Database

if TYPE_CHECKING:
    from .generators import IdGenerator

__all__ = ["InstanceMap", "MultiWriterStreamToken"]


class InstanceMap:
    """Two-way map between writer instance names and their compact numeric ids."""

    def __init__(self, names_to_ids: Mapping[str, int] | None = None) -> None:
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}
        for name, ident in (names_to_ids or {}).items():
            self._add(name, int(ident))

    def _add(self, name: str, ident: int) -> None:
        if self._names.get(ident, name) != name or self._ids.get(name, ident) != ident:
            raise ValueError(f"instance map conflict: {name!r} <-> {ident}")
        self._ids[name] = ident
        self._names[ident] = name

    def id_for(self, name: str) -> int:
        """The numeric id of ``name`` (KeyError with a hint if unknown)."""
        try:
            return self._ids[name]
        except KeyError:
            raise KeyError(f"writer {name!r} has no instance id; call InstanceMap.ensure(db, names) first") from None

    def name_for(self, ident: int) -> str:
        """The instance name of numeric id ``ident``."""
        try:
            return self._names[ident]
        except KeyError:
            raise KeyError(f"unknown writer id {ident}; reload the instance map (InstanceMap.load)") from None

    def as_dict(self) -> dict[str, int]:
        """name -> id."""
        return dict(self._ids)

    @classmethod
    async def load(cls, db: Database) -> InstanceMap:
        """Read the ``instance_map`` table (run migrations for "streams" first)."""
        rows = await db.fetchall("SELECT instance_name, instance_id FROM instance_map")
        return cls({str(n): int(i) for n, i in rows})

    @classmethod
    async def ensure(cls, db: Database, names: Iterable[str]) -> InstanceMap:
        """Give every name in ``names`` an id in ``instance_map`` (idempotent) and load the map."""
        for name in names:
            await db.execute(
                "INSERT INTO instance_map (instance_name) VALUES (?) ON CONFLICT (instance_name) DO NOTHING",
                (name,),
            )
        return await cls.load(db)


Names = Union[InstanceMap, Mapping[str, int]]


def _as_map(names: Names) -> InstanceMap:
    return names if isinstance(names, InstanceMap) else InstanceMap(names)


@dataclass(frozen=True)
class MultiWriterStreamToken:
    """A reader's position on a multi-writer stream.

    ``stream`` is the linear position (every writer is at least there);
    ``instance_map`` holds only the writers strictly ahead of it.
    """

    stream: int
    instance_map: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        cleaned: dict[str, int] = {}
        for name, pos in self.instance_map.items():
            if pos < self.stream:
                raise ValueError(
                    f"token entry {name!r}={pos} is behind the linear position {self.stream}; "
                    "every writer is at least at the minimum"
                )
            if pos > self.stream:
                cleaned[name] = int(pos)
        object.__setattr__(self, "instance_map", MappingProxyType(dict(sorted(cleaned.items()))))

    def __hash__(self) -> int:
        return hash((self.stream, tuple(self.instance_map.items())))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiWriterStreamToken):
            return NotImplemented
        return self.stream == other.stream and dict(self.instance_map) == dict(other.instance_map)

    # -- string form

    @classmethod
    def parse(cls, string: str, names: Names) -> MultiWriterStreamToken:
        """Parse ``42``, ``s42`` or ``m{min}~{id}.{pos}~...`` (ids resolved through ``names``)."""
        try:
            if string.startswith("m"):
                head, *parts = string[1:].split("~")
                stream = int(head)
                imap = _as_map(names)
                positions: dict[str, int] = {}
                for part in parts:
                    if not part:  # "m5~" from older writers
                        continue
                    ident, pos = part.split(".")
                    positions[imap.name_for(int(ident))] = int(pos)
                return cls(stream, positions)
            if string.startswith("s"):
                string = string[1:]
            if not string.isdigit():
                raise ValueError(string)
            return cls(int(string))
        except KeyError:
            raise
        except ValueError as err:
            raise ValueError(
                f"invalid stream token {string!r}: expected a position like '42' or 'm42~1.45~2.50' ({err})"
            ) from None

    def to_string(self, names: Names) -> str:
        """``str(stream)`` or ``m{stream}~{id}.{pos}~...`` (writers ordered by id)."""
        if not self.instance_map:
            return str(self.stream)
        imap = _as_map(names)
        entries = sorted((imap.id_for(name), pos) for name, pos in self.instance_map.items())
        return f"m{self.stream}~" + "~".join(f"{ident}.{pos}" for ident, pos in entries)

    # -- comparing and merging

    def get_stream_pos_for_instance(self, name: str) -> int:
        """Position of writer ``name`` in this token."""
        return self.instance_map.get(name, self.stream)

    def get_max_stream_pos(self) -> int:
        """The largest position referenced."""
        return max(self.instance_map.values(), default=self.stream)

    def is_before_or_eq(self, other: MultiWriterStreamToken) -> bool:
        """True if every writer's position here is <= its position in ``other``.

        A False answer does not mean ``other`` is before this one: tokens are
        only partially ordered.
        """
        if self.stream > other.stream:
            return False
        for name in set(self.instance_map) | set(other.instance_map):
            if self.get_stream_pos_for_instance(name) > other.get_stream_pos_for_instance(name):
                return False
        return True

    def copy_and_advance(self, other: MultiWriterStreamToken) -> MultiWriterStreamToken:
        """The least token at or after both (per-writer maximum)."""
        stream = max(self.stream, other.stream)
        merged = {
            name: max(self.get_stream_pos_for_instance(name), other.get_stream_pos_for_instance(name))
            for name in set(self.instance_map) | set(other.instance_map)
        }
        return MultiWriterStreamToken(stream, {n: p for n, p in merged.items() if p > stream})

    def bound_stream_token(self, max_stream: int) -> MultiWriterStreamToken:
        """This token with every position capped at ``max_stream``."""
        if self.get_max_stream_pos() <= max_stream:
            return self
        stream = min(self.stream, max_stream)
        return MultiWriterStreamToken(stream, {n: min(p, max_stream) for n, p in self.instance_map.items()})

    def is_position_after(self, instance_name: str, position: int) -> bool:
        """Whether a fact written by ``instance_name`` at ``position`` comes after this token."""
        return position > self.get_stream_pos_for_instance(instance_name)

    @classmethod
    def from_generator(cls, gen: IdGenerator) -> MultiWriterStreamToken:
        """The token of a generator's current positions (linear minimum plus writers ahead)."""
        low = gen.current_token()
        return cls(low, {n: p for n, p in gen.positions().items() if p > low})

    def __str__(self) -> str:
        ahead = ", ".join(f"{n}: {p}" for n, p in self.instance_map.items())
        return f"MultiWriterStreamToken({self.stream}, {{{ahead}}})"
