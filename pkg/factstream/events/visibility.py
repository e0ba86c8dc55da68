"""History visibility rules, as pure functions of the state at an event.

The store computes these eagerly when persisting (see ``store.py``); the
reference model in the tests calls the same definitions spelled out again.

Rules (user ``U``, event ``E``; "before"/"after" are the room state before and
after ``E``):

* effective visibility of ``E``: the more permissive of the
  ``m.room.history_visibility`` before and after ``E`` (``shared`` if unset;
  unknown values count as ``shared``), order world_readable > shared >
  invited > joined. So a visibility change is seen under the laxer setting.
* membership of ``U`` at ``E``: the more permissive of ``U``'s membership
  before and after ``E`` (join > invite > anything else). So a user sees their
  own join and their own leave/kick.
* ``U`` may see ``E`` when: visibility is world_readable; or ``U`` was joined;
  or visibility is invited and ``U`` was invited; or visibility is shared and
  ``U`` is joined at the query's position (the "joined later" rule of the
  Matrix spec, as Synapse implements it). A user's own membership events are
  always returned to them.
"""

from __future__ import annotations

__all__ = [
    "VISIBILITY_ORDER",
    "effective_visibility",
    "membership_at",
    "granted",
    "HISTORY_VISIBILITY",
    "MEMBER",
]

MEMBER = "m.room.member"
HISTORY_VISIBILITY = "m.room.history_visibility"

#: Most permissive first.
VISIBILITY_ORDER = ("world_readable", "shared", "invited", "joined")
_MEMBERSHIP_RANK = {"join": 2, "invite": 1}


def normalise_visibility(value: object) -> str:
    """A history_visibility content value, with unset/unknown meaning ``shared``."""
    return value if isinstance(value, str) and value in VISIBILITY_ORDER else "shared"


def effective_visibility(before: str, after: str) -> str:
    """The laxer of two (normalised) visibility values."""
    return min(before, after, key=VISIBILITY_ORDER.index)


def membership_at(before: str | None, after: str | None) -> str | None:
    """The more permissive of two memberships; only ``join``/``invite`` grant anything."""
    rb = _MEMBERSHIP_RANK.get(before or "", 0)
    ra = _MEMBERSHIP_RANK.get(after or "", 0)
    if max(rb, ra) == 0:
        return None
    return before if rb >= ra else after


def granted(visibility: str, membership: str | None, joined_now: bool) -> bool:
    """Whether a user with ``membership`` at an event of ``visibility`` may see it."""
    if visibility == "world_readable" or membership == "join":
        return True
    if visibility == "invited":
        return membership == "invite"
    if visibility == "shared":
        return joined_now
    return False
