"""Python's cyclic garbage collector, paused while one session object is read.

Pure (the standard library only). A session's audit and replay build structures that
stay alive until the session is done: every entry, the tree's nodes, the turns. Python's
automatic collections keep scanning them: young collections each object once or twice,
and full collections the whole live heap each time it has grown by a quarter, so the
time spent grows faster than the session: ~25% of the engine's replay of a 40,000-turn
session, and per doubling of turns 1.65-2.60x from run to run, against 1.97-2.10x
paused. The 1 GB benchmark session audits in 6.3 s instead of 7.2 s; the small
sessions of the benchmark fleet gain nothing measurable (docs/scaling.md).

What a paused collector gives up: cycles that become garbage during the session wait
for the end of it. Neither the audit nor the replay leaves any (a receipt's message is
looked up, not linked back: none of the audit's objects reach the collector, against 84
a session of the benchmark fleet when it was linked); when the pause ends, the next
automatic collection takes what there is.

A task holds a pause for its whole batch too (``pipeline.run.orchestrate.shipped``): it
keeps every audit of the batch until its tables are made, and full collections
rescanned them as they grew (~3% of an audit task over the fleet's small sessions).
Each object's own block then ends with a young collection (as under another thread's
pause), so what an object leaves (reading from S3 through s3fs leaves ~10 objects in
cycles) is still freed object by object, and no full collection runs in the task.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_holders = 0  # objects being read now, in any thread of this process
_resume = False  # whether the collector was on when the first of them started


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause automatic cyclic collection for the block (reentrant, thread-safe).

    The collector is paused when the first block of the process starts and resumed when
    the last one ends, if it was on before (a process that turned it off keeps it off).
    While the blocks of other threads still hold the pause (a ``memory://`` run's
    workers are threads of one process), a block that ends collects the young
    generations itself, so the cycles it left do not wait for all of them.
    """
    global _holders, _resume
    with _lock:
        if _holders == 0:
            _resume = gc.isenabled()
            gc.disable()
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            last = _holders == 0
            if last and _resume:
                gc.enable()
        if not last:
            gc.collect(1)  # outside the lock: a finalizer may start a block of its own


__all__ = ["cyclic_gc_paused"]
