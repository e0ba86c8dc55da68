"""StreamChangeCache: answers, eviction, and the earliest-known rule."""

from __future__ import annotations


from hypothesis import given
from hypothesis import strategies as st

from factstream.ids import StreamChangeCache


def test_answers_after_changes() -> None:
    cache = StreamChangeCache("rooms", current_stream_pos=10)
    assert not cache.has_entity_changed("!a", 10)
    assert not cache.has_any_entity_changed(10)
    cache.entity_has_changed("!a", 12)
    cache.entity_has_changed("!b", 13)
    cache.entity_has_changed("!a", 14)  # moves !a to 14
    cache.entity_has_changed("!b", 11)  # older than what is known: ignored
    assert cache.has_entity_changed("!a", 13)
    assert not cache.has_entity_changed("!a", 14)
    assert cache.has_entity_changed("!b", 12) and not cache.has_entity_changed("!b", 13)
    assert not cache.has_entity_changed("!c", 10)
    assert cache.get_entities_changed(["!a", "!b", "!c"], 13) == {"!a"}
    assert cache.get_entities_changed(["!a", "!b", "!c"], 10) == {"!a", "!b"}
    res = cache.get_all_entities_changed(12)
    assert res.hit and res.entities == ["!b", "!a"]
    assert cache.get_all_entities_changed(14).entities == []
    assert cache.get_max_pos_of_last_change("!a") == 14
    assert cache.get_max_pos_of_last_change("!zzz") == 10
    assert cache.has_any_entity_changed(13) and not cache.has_any_entity_changed(14)


def test_earliest_known_rule() -> None:
    """Before the earliest position the cache remembers, the answer is 'changed / unknown'."""
    cache = StreamChangeCache("rooms", current_stream_pos=10)
    cache.entity_has_changed("!a", 12)
    assert cache.has_entity_changed("!never", 9)
    assert cache.get_entities_changed(["!x", "!y"], 9) == {"!x", "!y"}
    miss = cache.get_all_entities_changed(9)
    assert not miss.hit and miss.entities is None
    assert cache.has_any_entity_changed(9)
    cache.entity_has_changed("!old", 10)  # at the earliest known position: not recordable
    assert not cache.has_entity_changed("!old", 10)


def test_eviction_by_distinct_positions() -> None:
    cache = StreamChangeCache("users", current_stream_pos=0, max_size=3)
    cache.entity_has_changed("@a", 1)
    cache.entity_has_changed("@b", 1)  # same position: one slot
    cache.entity_has_changed("@c", 2)
    cache.entity_has_changed("@d", 3)
    assert len(cache) == 3 and cache.earliest_known_position == 0
    cache.entity_has_changed("@e", 4)  # evicts position 1 (@a, @b)
    assert len(cache) == 3 and cache.earliest_known_position == 1
    assert cache.has_entity_changed("@a", 0)  # unknown -> changed
    assert not cache.has_entity_changed("@a", 1)  # known: @a did not change after 1
    assert cache.get_all_entities_changed(1).entities == ["@c", "@d", "@e"]
    assert not cache.get_all_entities_changed(0).hit
    cache.all_entities_changed(3)
    assert cache.earliest_known_position == 3 and len(cache) == 1
    assert cache.get_all_entities_changed(3).entities == ["@e"]


def test_prefill_and_out_of_order_positions() -> None:
    cache = StreamChangeCache("x", 5, prefilled_cache={"a": 9, "b": 7})
    cache.entity_has_changed("c", 8)
    assert cache.get_all_entities_changed(5).entities == ["b", "c", "a"]


@given(
    changes=st.lists(st.tuples(st.integers(0, 15), st.integers(1, 60)), max_size=80),
    max_size=st.integers(1, 12),
    since=st.integers(0, 60),
)
def test_never_a_wrong_no(changes: list[tuple[int, int]], max_size: int, since: int) -> None:
    """Against the full history: whatever the cache says 'not changed' really did not change."""
    cache = StreamChangeCache("h", 0, max_size=max_size)
    latest: dict[int, int] = {}
    for entity, pos in changes:
        cache.entity_has_changed(entity, pos)
        latest[entity] = max(latest.get(entity, 0), pos)
    truly = {e for e, p in latest.items() if p > since}
    for e in range(16):
        if not cache.has_entity_changed(e, since):
            assert e not in truly
    assert truly <= cache.get_entities_changed(range(16), since)
    res = cache.get_all_entities_changed(since)
    if res.hit:
        assert set(res.entities or []) == truly
    assert len(cache) <= max_size
