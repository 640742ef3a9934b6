"""A run's lifecycle seen from outside: its stage, its progress, and the signals that stop it.

Pure (no fsspec, dask or click): the orchestration names its stages here
(:func:`stage`), hands over each batch's counts (:func:`advance`), and runs its commit
under :func:`deferred_signals`; the command line installs :func:`handle_signals` and a
:class:`Reporter` (:func:`reporting`).

What is printed goes to stderr: on a terminal, one tqdm bar labelled by stage from the
first second; elsewhere (cron, Kubernetes), a heartbeat line every ``heartbeat`` seconds
(stage, sessions and bytes done, rate, ETA), as JSON lines with ``json_lines``, which
also get one line per stage change.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO

from tqdm import tqdm

STARTING_CLUSTER = "starting cluster"
LISTING = "listing"
READING = "reading"
COMMITTING = "committing"
SETUP = "setup"
#: Read only by tests: ``VAKPIPE_TEST_PAUSE_AT=<stage>`` sleeps this long on entering it,
#: so that a signal lands inside that stage deterministically.
PAUSE_ENV = "VAKPIPE_TEST_PAUSE_AT"
PAUSE_SECONDS = 30.0


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped the run; a BaseException, so no ``except Exception``
    on the way swallows it and every ``finally`` (staging removal, cluster close) runs."""

    def __init__(self, signum: int, stage: str, committed: bool = False) -> None:
        super().__init__(signum, stage)
        self.signum = signum
        self.stage = stage
        self.committed = committed

    @property
    def name(self) -> str:
        """``SIGINT`` or ``SIGTERM``."""
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number (130, 143), as a shell reports it."""
        return 128 + self.signum

    def line(self) -> str:
        """The one line printed for it."""
        after = ("the run was committed before stopping" if self.committed
                 else "previous output intact")
        return f"vakpipe: interrupted ({self.name}) during {self.stage}; {after}"


def _human(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


class Reporter:
    """Stage and progress of the runs of one command, on stderr.

    Parameters
    ----------
    progress:
        Show a tqdm bar (default: when ``stream`` is a terminal).
    heartbeat:
        Seconds between heartbeat lines when there is no bar; ``None`` or 0: none.
    json_lines:
        Print heartbeats and stage changes as JSON lines (``--log-format json``).
    stream:
        Where to print (default ``sys.stderr``).
    """

    def __init__(self, *, progress: bool | None = None, heartbeat: float | None = None,
                 json_lines: bool = False, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.progress = progress
        self.heartbeat = heartbeat or None
        self.json_lines = json_lines
        self.current = SETUP
        self.sessions_total = self.bytes_total = 0
        self.sessions_done = self.bytes_done = 0
        #: How the command ended (:meth:`end`), for the last JSON line.
        self.exit_code: int | None = None
        self.error: str | None = None
        self._started = time.monotonic()
        self._reading_since: float | None = None
        self._bar: tqdm | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def _bar_wanted(self) -> bool:
        if self.progress is not None:
            return self.progress
        return bool(getattr(self.stream, "isatty", lambda: False)())

    def stage(self, name: str, *, sessions: int | None = None,
              nbytes: int | None = None) -> None:
        """Enter stage ``name``; ``sessions`` and ``nbytes`` are its totals (reading)."""
        with self._lock:
            self.current = name
            if sessions is not None:
                self.sessions_total, self.sessions_done = sessions, 0
            if nbytes is not None:
                self.bytes_total, self.bytes_done = nbytes, 0
                self._reading_since = time.monotonic()
            if self._bar_wanted():
                if self._bar is None:
                    self._bar = tqdm(total=None, unit="B", unit_scale=True, desc=name,
                                     file=self.stream, leave=False)
                self._bar.set_description_str(name, refresh=False)
                if nbytes is not None:
                    self._bar.reset(total=nbytes)
                self._bar.refresh()
            elif self.json_lines:
                self._emit("stage")
        self._start_ticker()
        _pause_if_asked(name)

    def advance(self, sessions: int, nbytes: int) -> None:
        """Count a finished batch."""
        with self._lock:
            self.sessions_done += sessions
            self.bytes_done += nbytes
            if self._bar is not None:
                self._bar.update(nbytes)

    def snapshot(self) -> dict[str, Any]:
        """The figures of a heartbeat."""
        now = time.monotonic()
        since = self._reading_since
        rate = (self.bytes_done / (now - since)) if since is not None and now > since else 0.0
        left = self.bytes_total - self.bytes_done
        eta = round(left / rate, 1) if rate > 0 and self.current == READING else None
        return {"stage": self.current, "elapsed_s": round(now - self._started, 1),
                "sessions_done": self.sessions_done, "sessions_total": self.sessions_total,
                "bytes_done": self.bytes_done, "bytes_total": self.bytes_total,
                "rate_bytes_per_s": round(rate), "eta_s": eta}

    def end(self, exit_code: int, error: str | None = None) -> None:
        """Say how the command ended: its exit code and, when it failed, the one line
        saying why; the last JSON line (``done``, or ``failed``) carries them."""
        self.exit_code, self.error = exit_code, error

    def _emit(self, event: str) -> None:
        s = self.snapshot()
        if self.json_lines:
            record = {"event": event, "ts": round(time.time(), 3), **s}
            if event in ("done", "failed") and self.exit_code is not None:
                record["exit"] = self.exit_code
                if self.error is not None:
                    record["error"] = self.error
            line = json.dumps(record)
        else:
            eta = f", ETA {s['eta_s']:.0f}s" if s["eta_s"] is not None else ""
            line = (f"vakpipe: {s['stage']}: {s['sessions_done']:,}/{s['sessions_total']:,} "
                    f"sessions, {_human(s['bytes_done'])}/{_human(s['bytes_total'])}, "
                    f"{_human(s['rate_bytes_per_s'])}/s{eta}, {s['elapsed_s']:.0f}s elapsed")
        print(line, file=self.stream, flush=True)

    def _start_ticker(self) -> None:
        if self._ticker is not None or (self._bar is None and self.heartbeat is None):
            return
        # A bar refreshes every second (its elapsed time moves while nothing is read yet);
        # without one, a heartbeat line every `heartbeat` seconds.
        period = 1.0 if self._bar is not None else float(self.heartbeat or 1.0)

        def tick() -> None:
            while not self._stop.wait(period):
                with self._lock:
                    if self._bar is not None:
                        self._bar.refresh()
                    else:
                        self._emit("heartbeat")

        self._ticker = threading.Thread(target=tick, name="vakpipe-heartbeat", daemon=True)
        self._ticker.start()

    def close(self) -> None:
        """Stop the ticker, clear the bar; with JSON lines, a last ``done`` line (after a
        run) or ``failed`` line (whatever the stage: a collector sees why it ended)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=2)
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self.json_lines and self.error is not None:
                self._emit("failed")
            elif self.json_lines and self.current != SETUP:
                self._emit("done")


_reporter = Reporter()


def current() -> Reporter:
    """The reporter in force (a quiet default outside the command line)."""
    return _reporter


@contextmanager
def reporting(reporter: Reporter) -> Iterator[Reporter]:
    """Make ``reporter`` the one in force for the block; closed at its end."""
    global _reporter
    before, _reporter = _reporter, reporter
    try:
        yield reporter
    finally:
        reporter.close()
        _reporter = before


def stage(name: str, *, sessions: int | None = None, nbytes: int | None = None) -> None:
    """Enter stage ``name`` (see :meth:`Reporter.stage`)."""
    _reporter.stage(name, sessions=sessions, nbytes=nbytes)


def advance(sessions: int, nbytes: int) -> None:
    """Count a finished batch (see :meth:`Reporter.advance`)."""
    _reporter.advance(sessions, nbytes)


def _pause_if_asked(name: str) -> None:
    if os.environ.get(PAUSE_ENV) == name:
        time.sleep(PAUSE_SECONDS)


# --- signals -----------------------------------------------------------------------------

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_deferring = False
_pending: int | None = None
_stopping = False


def _mute() -> None:
    # A stopping cluster logs its workers' deaths and closing comms as warnings and
    # errors with tracebacks: noise once the user asked to stop.
    for name in ("distributed", "tornado", "asyncio"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _pending, _stopping
    if _stopping:
        # A second signal while the first one's cleanup runs: stop at once (the staging
        # folder may stay; the next run of the same output removes it).
        os._exit(128 + signum)
    _mute()
    if _deferring:
        _pending = signum
        return
    _stopping = True
    raise Interrupted(signum, _reporter.current)


@contextmanager
def handle_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` in the main thread for the block
    (outside the main thread, or already handled: nothing changes)."""
    global _stopping, _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _on_signal) for s in _STOP_SIGNALS}
    _stopping, _pending = False, None
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block (a commit): one arriving inside it is raised
    as :class:`Interrupted` (``committed=True``) once the block has finished."""
    global _deferring, _pending, _stopping
    _deferring = True
    try:
        yield
    finally:
        _deferring = False
    if _pending is not None:
        signum, _pending = _pending, None
        _stopping = True
        raise Interrupted(signum, COMMITTING, committed=True)


def dask_setup(worker: object) -> None:
    """Worker preload (``preload=["pipeline.run.lifecycle"]``): a LocalCluster's worker
    ignores SIGINT. A Ctrl-C reaches the whole process group; only the command, which
    closes the cluster in order, acts on it, instead of every worker printing a
    KeyboardInterrupt traceback. SIGTERM keeps its default: a worker stops silently."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def children_ignore_interrupt() -> Iterator[None]:
    """SIGINT ignored while a LocalCluster starts: its worker processes inherit the
    ignored disposition from their first instruction (the preload, :func:`dask_setup`,
    runs only once a worker is up), so a Ctrl-C to the process group prints no
    traceback of a half-started worker. A SIGINT in these seconds is lost (SIGTERM is
    not); outside the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
