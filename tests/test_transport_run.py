"""``factstream.transport.run``: Ctrl-C cancels the main coroutine from inside the loop.

Each case runs in a subprocess of its own (signals and the main thread's
SIGINT handler are process-wide), sends itself SIGINT while the coroutine
keeps handing work to a thread (the path where a signal handler landing
inside asyncio's copy of the thread's result logged an InvalidStateError),
and prints what it saw.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys, threading, time
    from factstream import transport

    cleaned = []

    async def main():
        loop = asyncio.get_running_loop()
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            while True:  # results copied from the executor into awaited futures, back to back
                await loop.run_in_executor(None, time.sleep, 0)
        finally:
            await asyncio.sleep(0)  # cleaning up may still await
            cleaned.append(True)

    if sys.argv[1] == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        async def short():
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(0.2)
            return "ran to the end"
        print(transport.run(short, use_uvloop=sys.argv[2] == "uvloop"))
        sys.exit(0)
    try:
        transport.run(main, use_uvloop=sys.argv[2] == "uvloop")
    except KeyboardInterrupt:
        print("KeyboardInterrupt after cleanup" if cleaned else "KeyboardInterrupt without cleanup")
    """
)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_ctrl_c_cancels_inside_the_loop_then_raises_keyboard_interrupt(loop: str) -> None:
    for _ in range(5):  # the race was rare; each round is a fresh process
        proc = subprocess.run([sys.executable, "-c", SCRIPT, "default", loop], capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "KeyboardInterrupt after cleanup", proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr and "InvalidStateError" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_an_ignored_sigint_stays_ignored(loop: str) -> None:
    # The demos' reader processes ignore Ctrl-C: their writer decides when they stop.
    proc = subprocess.run([sys.executable, "-c", SCRIPT, "ignored", loop], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ran to the end"
