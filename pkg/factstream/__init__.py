"""factstream: streams of facts and their replication between processes.

``IMPL`` says which implementation is active: ``"c"`` (the compiled Cython
core) or ``"python"`` (the pure twins, e.g. with FACTSTREAM_NO_EXTENSIONS=1).
"""

from __future__ import annotations

from ._compat import IMPL
from .errors import FactstreamError, ProtocolError

__version__ = "0.1.0"
__all__ = ["IMPL", "FactstreamError", "ProtocolError", "__version__"]
