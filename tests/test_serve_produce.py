"""serve's producer (cli.serve.Writer) in this process, on a real SQLite database: groups in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from factstream.cli import build_parser
from factstream.cli.serve import Writer


async def test_a_failing_group_stops_producing_and_leaves_no_group_running(tmp_path: Path) -> None:
    """An unexpected error in one group ends produce() with it, and the group in flight behind it is
    cancelled, not left running on its own (its ids complete, so the position is not held back)."""
    args = build_parser().parse_args(
        ["serve", "--db", f"sqlite:///{tmp_path / 'w.db'}", "--port", "0", "--produce", "--seed", "1"]
    )
    writer = Writer(args)
    await writer.start()
    try:
        real = writer._produce_group  # noqa: SLF001 - the step this test makes fail
        calls = 0

        async def produce_group(*a: Any, **kw: Any) -> None:
            nonlocal calls
            calls += 1
            if calls == 5:
                raise RuntimeError("injected")
            await real(*a, **kw)

        writer._produce_group = produce_group  # type: ignore[method-assign]  # noqa: SLF001
        with pytest.raises(RuntimeError, match="injected"):
            await writer.produce(asyncio.Event())
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and "produce_group" in repr(t)]
        await asyncio.sleep(0.05)
        assert all(t.done() for t in others), others
        assert calls == 5 and writer.stats["transactions"] > 0
        for gen in writer.gens.values():  # every id reserved completed: nothing holds a position back
            assert gen.current_token() == gen.max_token()
    finally:
        await writer.stop()
