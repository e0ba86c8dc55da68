"""Merging the state of several prev_events (forks): the pluggable resolver.

Why pluggable: full Matrix state resolution needs auth rules and power levels,
which belong to the homeserver, not to storage. The store only needs a pure,
deterministic function from the forks' states to one state.

The default, :class:`DepthResolver`, keeps every key any fork has (state keys
are never removed in Matrix) and, where forks disagree, picks the event with
the greatest depth, ties broken by the greatest event_id (plain string order).
It is symmetric in its inputs, so the order of prev_events never matters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

__all__ = ["StateKey", "StateMap", "StateResolver", "DepthResolver"]

StateKey = tuple[str, str]
StateMap = dict[StateKey, str]


class StateResolver(Protocol):
    """Resolves conflicting fork states into one state map."""

    def __call__(
        self, room_id: str, states: Sequence[Mapping[StateKey, str]], depths: Mapping[str, int]
    ) -> StateMap:
        """``states``: one map per fork; ``depths``: depth of every event named in them."""
        ...


class DepthResolver:
    """Union of keys; conflicts go to the deepest event, then the greatest event_id."""

    def __call__(
        self, room_id: str, states: Sequence[Mapping[StateKey, str]], depths: Mapping[str, int]
    ) -> StateMap:
        if not states:
            return {}
        out: StateMap = dict(states[0])
        for state in states[1:]:
            for key, ev in state.items():
                cur = out.get(key)
                if cur is None or (cur != ev and (depths[ev], ev) > (depths[cur], cur)):
                    out[key] = ev
        return out


def conflicted_events(states: Sequence[Mapping[StateKey, str]]) -> set[str]:
    """Event ids under keys on which the forks disagree (what a resolver needs depths for)."""
    seen: dict[StateKey, str] = {}
    conflicted: set[StateKey] = set()
    for state in states:
        for key, ev in state.items():
            cur = seen.setdefault(key, ev)
            if cur != ev:
                conflicted.add(key)
    return {ev for state in states for key, ev in state.items() if key in conflicted}
