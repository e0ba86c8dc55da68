"""The JSON status lines long-running commands print for a parent process to read.

``factstream serve --status`` and the live demo's readers report progress as
one JSON object per line on stdout, flushed at once, so a parent (the demo,
a test, an operator's script) sees each as it happens.
"""

from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["emit"]


def emit(obj: dict[str, Any]) -> None:
    """Print ``obj`` as one JSON line on stdout and flush it."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
