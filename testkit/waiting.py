"""Waiting for a condition instead of sleeping a fixed time (tests/conftest.py: tests control time).

A test that must wait for real processes or sockets polls for what it waits for, with a
deadline that says what never happened; a test of code that takes a clock passes it one."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable


async def until(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float, what: str,
                interval_s: float = 0.05) -> None:
    """Return as soon as `predicate()` (plain or awaitable) is true; AssertionError naming
    `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen in {timeout_s:.0f} s")
        await asyncio.sleep(interval_s)
