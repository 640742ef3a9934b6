"""Peak resident memory of this process, as the benchmarks and memory tests report it."""

from __future__ import annotations

import resource


def peak_rss_bytes() -> int:
    """This process's peak resident size so far, in bytes.

    Linux's ``VmHWM`` is the high-water mark of this process's own address space. Not
    ``ru_maxrss``: that one survives ``fork`` and ``exec``, so a process started by a
    large parent (a pytest session 340 MB into the suite) reports the parent's size as
    its own peak.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB elsewhere
