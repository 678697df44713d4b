"""The garbage collector while a command that loads the plugins starts (evaluate, compare,
check, verify, plugins, list with its cache off): no full collection until torch, the
plugins and the plan are loaded, then everything alive is frozen.

Once torch is imported, a full collection scans 170,000-240,000 objects, and Python runs one
whenever the long-lived objects have grown by a quarter since the last: four during the
imports (0.02-0.15 s of CPU each, 0.28 s in all), each freeing 10-2,434 objects; and the
interpreter's exit collects them all again. Held off during the start-up, then frozen
(``gc.freeze``: later collections, those at exit included, skip what was alive), a tiny
plan's command takes 0.67-0.70 of its CPU time (paired medians, bench/startup.py
--collector): 0.27 s saved while it runs, ~0.6 s at its exit. The other commands gain
alike (session 21): compare 0.71, check 0.69, verify 0.75, an uncached list 0.67, plugins
0.64; their output and stored results are bit-identical either way.

Only where the command is the whole process (the console script, ``python -m
aisafety.cli``): a library, or ``main`` called from Python, must not change its caller's
collector. Young collections go on throughout, so what is frozen is what the start-up
keeps (~236,000 objects) and ~570 garbage objects (~60 kB, mostly the argument parser),
never freed; peak memory +1.6 MB of 343 MB. An object alive at the freeze is still freed
when its last reference goes; only a cycle among them would stay. Ray's processes are
started afresh, not forked; a forked child inherits the freeze, which Python's docs
recommend before ``fork``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# generations[2]'s count (young collections since the last full one) never reaches this
HELD = 1 << 30


@contextmanager
def starting(whole_process: bool) -> Iterator[None]:
    """Within the block, no full collection; after it, everything alive frozen and the
    thresholds as they were. Nothing changes unless ``whole_process``."""
    if not whole_process:
        yield
        return
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], HELD)
    try:
        yield
    finally:
        gc.freeze()
        gc.set_threshold(*thresholds)
