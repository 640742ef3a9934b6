"""Types of the C per-line kernel (pipeline/ledger/_ckernel.c)."""

from typing import Any

MAX_DEPTH: int

def scan(body: bytes, /) -> tuple[Any, ...] | None: ...
def valid(body: bytes, /) -> bool: ...
