"""Parsing Python source into an AST, safely from any thread.

CPython 3.11 counts AST-construction depth in interpreter-wide state, so two threads in
``ast.parse`` at once (one paused by a finalizer that releases the GIL mid-parse) can fail with
``SystemError: AST constructor recursion depth mismatch`` (python/cpython#106905). Proposers
are called from thread pools (two codegen subprocesses at a time), so every parse in kernelab
goes through one lock; a parse takes milliseconds, far below a proposal's cost.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)`` under the process-wide parse lock."""
    with _LOCK:
        return ast.parse(source, filename=filename)
