"""MultiWriterStreamToken: string form, comparison, merging; InstanceMap on both engines."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream.ids import InstanceMap, MultiWriterStreamToken, create_id_generator
from factstream.store.database import connect
from factstream.store.migrations import migrate

NAMES = {"w1": 1, "w2": 2, "w3": 3}
T = MultiWriterStreamToken


def test_string_forms() -> None:
    assert T(42).to_string(NAMES) == "42"
    tok = T(56, {"w2": 58, "w3": 59})
    assert tok.to_string(NAMES) == "m56~2.58~3.59"
    assert T.parse("m56~2.58~3.59", NAMES) == tok
    assert T.parse("42", NAMES) == T(42)
    assert T.parse("s42", NAMES) == T(42)
    assert T.parse("m5~", NAMES) == T(5)  # older writers sent a trailing ~
    assert T(5, {"w1": 5}).instance_map == {}  # entries equal to the minimum are redundant


@pytest.mark.parametrize("bad", ["", "m", "x5", "m5~1", "m5~1.x", "-3", "m5~1.2.3"])
def test_invalid_tokens(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid stream token"):
        T.parse(bad, NAMES)


def test_unknown_writer_ids_and_names() -> None:
    with pytest.raises(KeyError, match="unknown writer id 9"):
        T.parse("m5~9.7", NAMES)
    with pytest.raises(KeyError, match="no instance id"):
        T(5, {"nobody": 6}).to_string(NAMES)
    with pytest.raises(ValueError, match="behind the linear position"):
        T(5, {"w1": 4})


def test_compare_and_merge() -> None:
    a = T(5, {"w1": 8})
    b = T(6, {"w2": 9})
    assert not a.is_before_or_eq(b)  # w1: 8 > 6
    assert not b.is_before_or_eq(a)  # only partially ordered
    m = a.copy_and_advance(b)
    assert m == T(6, {"w1": 8, "w2": 9})
    assert a.is_before_or_eq(m) and b.is_before_or_eq(m)
    assert m.get_max_stream_pos() == 9
    assert m.get_stream_pos_for_instance("w3") == 6
    assert m.is_position_after("w1", 9) and not m.is_position_after("w1", 8)
    assert m.bound_stream_token(7) == T(6, {"w1": 7, "w2": 7})
    assert m.bound_stream_token(100) is m
    assert hash(T(3, {"w1": 4})) == hash(T(3, {"w1": 4}))


tokens = st.builds(
    lambda s, extra: T(s, {n: s + d for n, d in extra.items()}),
    st.integers(1, 50),
    st.dictionaries(st.sampled_from(sorted(NAMES)), st.integers(0, 10)),
)


@given(a=tokens, b=tokens)
def test_properties(a: T, b: T) -> None:
    assert T.parse(a.to_string(NAMES), NAMES) == a
    m = a.copy_and_advance(b)
    assert a.is_before_or_eq(m) and b.is_before_or_eq(m)
    assert m == b.copy_and_advance(a)
    assert a.is_before_or_eq(a)
    if a.is_before_or_eq(b) and b.is_before_or_eq(a):
        assert a == b


ENGINES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("engine", ENGINES)
async def test_instance_map_table_and_generator_token(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url = f"sqlite:///{tmp_path / 't.db'}" if engine == "sqlite" else request.getfixturevalue("postgres_dsn")
    db = await connect(url)
    try:
        await migrate(db, ["streams"])
        imap = await InstanceMap.ensure(db, ["w1", "w2"])
        again = await InstanceMap.ensure(db, ["w2", "w3"])
        assert again.id_for("w1") == imap.id_for("w1") and again.id_for("w2") == imap.id_for("w2")
        assert again.name_for(again.id_for("w3")) == "w3"
        gen = await create_id_generator(db, stream_name="s", instance_name="w1", writers=("w1",))
        async with gen.get_next_mult(3):
            pass
        tok = T.from_generator(gen)
        assert tok == T(4)
        assert T.parse(tok.to_string(again), again) == tok
        await gen.close()
    finally:
        await db.close()
