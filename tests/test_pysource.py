"""kernelab's parse is safe while another thread is mid-parse (python/cpython#106905)."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

import pytest

from kernelabd.pysource import parse

SOURCE = "\n".join(f"def f{i}(x):\n    return [x + {i} for _ in range(3)]" for i in range(200))


def _interleave(parse_fn: Callable[[str], object]) -> list[BaseException]:
    """Thread A starts a parse; a garbage collection inside it runs a finalizer that releases
    the GIL long enough for thread B to parse too — the interleaving a thread pool of proposers
    meets by chance, made certain."""
    errors: list[BaseException] = []
    b_may_start = threading.Event()
    b_started = threading.Event()

    class Finalized:
        fired = False

        def __init__(self) -> None:
            self.cycle = self

        def __del__(self) -> None:
            if not Finalized.fired:
                Finalized.fired = True
                b_may_start.set()
                b_started.wait(2)
                time.sleep(0.2)

    def run(fn: Callable[[], object]) -> None:
        try:
            fn()
        except BaseException as exc:  # the test reports whatever escaped
            errors.append(exc)

    def thread_a() -> None:
        gc.collect()
        Finalized()
        parse_fn(SOURCE)

    def thread_b() -> None:
        b_may_start.wait(2)
        b_started.set()
        parse_fn(SOURCE)

    threshold = gc.get_threshold()
    gc.set_threshold(50)
    try:
        threads = [threading.Thread(target=run, args=(t,)) for t in (thread_a, thread_b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
    finally:
        gc.set_threshold(*threshold)
    assert Finalized.fired, "no collection ran inside the parse: the test proved nothing"
    return errors


def test_parse_survives_a_concurrent_parse() -> None:
    assert _interleave(parse) == []
    assert parse("x = 1").body


@pytest.mark.parametrize("source", ["def f(:\n", "x = (\n"])
def test_parse_reports_bad_source_as_syntax_error(source: str) -> None:
    with pytest.raises(SyntaxError):
        parse(source)
