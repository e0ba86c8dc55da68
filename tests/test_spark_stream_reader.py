"""The ``factstream`` Spark stream source's reader, without a JVM: bad options surface as themselves.

pyspark's stream-reader runner calls ``reader.stop()`` in a ``finally`` that
also covers the reader's constructor, so a constructor that raises is
reported as "UnboundLocalError: ... 'reader'". The reader must therefore
never raise when made, and say what is wrong on its first call.
"""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pyspark") is None or importlib.util.find_spec("pyarrow") is None,
    reason="pyspark and pyarrow are needed for the stream source",
)


def _tables_json() -> str:
    from factstream.demo.tables import DEMO_TABLES
    from factstream.replication.tables import tables_to_json

    return tables_to_json(DEMO_TABLES)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"db": "sqlite:///x.db", "streams": "caches,nosuch"}, "unknown stream(s) nosuch; known: caches, receipts, to_device"),
        ({"streams": "caches"}, "needs the 'db' option"),
        ({"db": "sqlite:///x.db", "tables": ""}, "needs the 'tables' option"),
        ({"db": "sqlite:///x.db", "tokensPerTask": "many"}, "invalid literal for int()"),
    ],
)
def test_bad_options_are_raised_by_the_first_call_not_the_constructor(options: dict[str, str], message: str) -> None:
    from factstream.spark.streaming import ReplicationStreamReader

    reader = ReplicationStreamReader({"tables": _tables_json(), **options})  # must not raise
    for call in (reader.initialOffset, reader.latestOffset):
        with pytest.raises(ValueError) as err:
            call()
        assert message in str(err.value)
    reader.stop()  # what pyspark's runner calls in its finally


def test_good_options_follow_the_chosen_streams() -> None:
    from factstream.spark.streaming import ReplicationStreamReader

    reader = ReplicationStreamReader({"db": "sqlite:///x.db", "tables": _tables_json(), "streams": " receipts, caches "})
    assert reader.initialOffset() == {"receipts": {}, "caches": {}}
