"""Memory that this user's other AISafety processes have claimed but not yet taken.

The default memory budget is a fraction of the memory available now. Several processes
started together (a sweep's jobs, ``pytest -n``, two engineers' runs) each read the same
free memory before any of them has allocated, and each took half of it: a run was
OOM-killed that way. So each process records its default budget as a claim in a small
file under the temporary directory (``ledger_dir``, one file per process id, written under
a lock), and a process reading its budget first subtracts what the others' live claims
have not yet taken: a claim less the resident growth of its process since the claim. Its
own ancestors' claims are not counted: a parent's claim is for the work it hands its
children. A claim ends with its process, or ``CLAIM_SECONDS`` after it was last renewed:
by then the work it was for has allocated (every call reads its budget anew, renewing the
claim), and the kernel's available memory counts it. ``AISAFETY_MEMORY_LEDGER`` names
another directory; ``0`` turns the ledger off. Where the directory cannot be written, no
claims are counted. A claim records its process's start time too, so a new process that
reuses an ended one's id does not inherit its claim.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

CLAIM_SECONDS = 60.0


def ledger_dir() -> Path | None:
    """The ledger's directory (None: turned off)."""
    chosen = os.environ.get("AISAFETY_MEMORY_LEDGER", "")
    if chosen == "0":
        return None
    return Path(chosen or Path(tempfile.gettempdir()) / f"aisafety-memory-{os.getuid()}")


def claim(budget_of: Callable[[int], int]) -> int:
    """This process's budget, ``budget_of(bytes the other processes' claims have not yet
    taken)``, recorded as its claim. Read and written under the ledger's lock."""
    folder = ledger_dir()
    if folder is None:
        return budget_of(0)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            budget = budget_of(others_pending(folder))
            _record(folder, budget)
            return budget
    except OSError:
        return budget_of(0)


def others_pending(folder: Path) -> int:
    """Sum over the other live, unexpired claims of the part not yet taken; the files of
    ended processes are removed."""
    total, now, mine = 0, time.time(), ancestors()
    for path in folder.iterdir():
        if not path.name.isdigit() or int(path.name) in mine:
            continue
        pid = int(path.name)
        resident = resident_bytes(pid)
        try:
            claimed, resident_then, start = map(int, path.read_text().split())
            if resident is None or started(pid) != start:
                path.unlink()  # its process has ended (another may have taken its id)
                continue
            if now - path.stat().st_mtime > CLAIM_SECONDS:
                continue
        except (OSError, ValueError):
            continue
        total += max(0, claimed - max(0, resident - resident_then))
    return total


def ancestors() -> set[int]:
    """This process and the processes it descends from: a parent's claim is for the work it
    hands its children (a test run's subprocess, a runner's worker), not beside it."""
    chain, pid = set(), os.getpid()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        pid = _parent(pid)
    return chain


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def resident_bytes(pid: int) -> int | None:
    """``VmRSS`` of process ``pid`` in bytes; None where it no longer runs."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return 0
    return 0  # a zombie: no resident memory


def started(pid: int) -> int:
    """When process ``pid`` started, in clock ticks since boot (``/proc/PID/stat``'s field
    22); -1 where it cannot be read. With the id it names one process, across id reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()
        return int(after_name[19])  # fields 3.. follow the name; 22 is the start time
    except (OSError, IndexError, ValueError):
        return -1


def _record(folder: Path, budget: int) -> None:
    """This process's claim: the budget, its resident size and its start time now
    (atomically replaced)."""
    pid = os.getpid()
    path = folder / str(pid)
    scratch = folder / f".{pid}"
    scratch.write_text(f"{budget} {resident_bytes(pid) or 0} {started(pid)}")
    os.replace(scratch, path)
    if path not in _RECORDED:
        _RECORDED.add(path)
        atexit.register(path.unlink, missing_ok=True)


_RECORDED: set[Path] = set()
