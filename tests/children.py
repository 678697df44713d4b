"""Child processes of the test suite: each in its own session, killed with its whole group.

Killing ``bash -c`` alone leaves its children (``aisafety report ...``) running as orphans
that load a busy machine further; a child started here is the leader of a new process group,
so a timeout kills everything it started. Every child also inherits ``SESSION_VARIABLE``
(set by tests/conftest.py), by which the suite finds, at its end, any process it left alive.

Limits here are generous and only guard against a hang: a test bounds its work by
iterations, not by time, so a busy CI machine makes it slower, never failing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

SESSION_VARIABLE = "AISAFETY_TEST_SESSION"
HANG_LIMIT = 1800.0  # s: far beyond any test's work on a loaded 2-core machine


def start(args: list[str] | str, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` as the leader of a new session (and so of a new process group)."""
    return subprocess.Popen(args, start_new_session=True, **kwargs)


def kill_group(process: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the child's whole process group, SIGKILL to what is left after ``grace``
    seconds; returns once no member of the group is running."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        deadline = time.monotonic() + grace
        while _group_alive(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _group_alive(process.pid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace)


def run(
    args: list[str] | str, *, what: str = "", timeout: float = HANG_LIMIT, **kwargs: Any
) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a new session; on ``timeout`` the whole group is killed and the
    test fails naming ``what``, the limit and the output so far (never an orphan)."""
    if kwargs.pop("capture_output", False):
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    check = kwargs.pop("check", False)
    process = start(args, **kwargs)
    out, err = communicate(process, what=what, timeout=timeout)
    done = subprocess.CompletedProcess(process.args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def run_together(
    commands: list[list[str]], *, what: str = "", timeout: float = HANG_LIMIT, **kwargs: Any
) -> list[subprocess.CompletedProcess]:
    """``run`` of each command, all started at once: while pytest waits on one child the
    machine's other core would idle (independent measurements in fresh processes). On a hang
    or an error in one, the groups of those not yet waited for are killed too."""
    if kwargs.pop("capture_output", False):
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
    started = [start(command, **kwargs) for command in commands]
    try:
        done = []
        for process in started:
            out, err = communicate(process, what=what, timeout=timeout)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
        return done
    finally:
        for process in started:
            if process.returncode is None:
                kill_group(process)


def communicate(
    process: subprocess.Popen, *, what: str = "", timeout: float = HANG_LIMIT
) -> tuple[Any, Any]:
    """``process.communicate()``, the group killed on ``timeout`` (the test then fails naming
    ``what``) or on any error, and any grandchild that outlived the child killed too."""
    what = what or f"the child process {str(process.args)[:200]}"
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        raise AssertionError(
            f"{what} did not finish within {timeout:g} s (a hang guard far beyond its work; "
            f"is the machine overloaded?); its process group was killed.\n"
            f"--- stdout\n{_tail(out)}\n--- stderr\n{_tail(err)}"
        ) from None
    except BaseException:
        kill_group(process)
        raise
    finally:
        if _group_alive(process.pid):
            kill_group(process)


def leftovers(token: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries ``token``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            zombie = (entry / "stat").read_text().split(") ")[-1].startswith("Z")
        except OSError:
            continue  # gone, or not ours to read
        if f"{SESSION_VARIABLE}={token}".encode() in environ.split(b"\0") and not zombie:
            found.append((int(entry.name), command.strip()))
    return found


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running (zombies, dead but not yet
    reaped by their parent, do not count)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _tail(text: str | bytes | None, size: int = 3000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-size:]
