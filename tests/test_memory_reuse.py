"""Freed memory reused (aisafety/memory.py), measured in page faults.

Each case runs in a fresh process: what a large allocation costs depends on the heap's
history, and earlier tests in this process leave free chunks behind.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading

import children
import pytest

from aisafety import memory

pytestmark = pytest.mark.skipif(memory._libc() is None, reason="needs glibc's mallopt")
BLOCK = 64 << 20  # bytes: above glibc's largest dynamic mmap threshold (32 MiB)
PAGES = BLOCK // resource.getpagesize()

CASE = """
import ctypes, json, resource, torch
from aisafety.memory import reuse_freed_memory

# Faults are counted in base pages: where transparent huge pages back anonymous memory (a
# kernel set to "always", glibc.malloc.hugetlb=1) one fault maps 2 MiB, and a block mapped
# anew every round cost 3,309 faults in 6 rounds, not >= 5 x 16,384. PR_SET_THP_DISABLE
# (41) turns them off for this process only; the reuse measured does not depend on them.
assert ctypes.CDLL(None).prctl(41, 1, 0, 0, 0) == 0

def faults(rounds=6):
    # minor page faults of allocating, writing and freeing one large tensor `rounds` times
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        block = torch.empty(%(block)d // 4)
        block.fill_(1.0)
        del block
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()

found = {"outside": faults()}
with reuse_freed_memory():
    faults(12)  # the heap settles: glibc's aligned allocations need a few holes to coalesce
    found["inside"] = faults()
    with reuse_freed_memory():
        faults(1)
    found["inner_ended"] = faults()
    blocks = [torch.ones(%(block)d // 4) for _ in range(6)]
    del blocks
    found["kept"] = resident()
found["trimmed"] = resident()
print(json.dumps(found))
"""


def run_case(**env: str) -> dict[str, int]:
    code = CASE % {"block": BLOCK}
    out = children.run([sys.executable, "-c", code], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def test_inside_a_freed_block_is_reused_and_given_back_at_the_end():
    found = run_case(AISAFETY_REUSE_FREED_MEMORY="1")
    assert found["outside"] >= 5 * PAGES  # every round maps and faults the block in anew
    assert found["inside"] <= PAGES // 2  # once the heap has settled, every round reuses it
    assert found["inner_ended"] <= PAGES // 2  # a nested block's end changes nothing
    # the six blocks stayed in the heap until the end, then malloc_trim gave them back
    assert found["kept"] - found["trimmed"] >= 4 * BLOCK


def test_the_environment_turns_it_off():
    found = run_case(AISAFETY_REUSE_FREED_MEMORY="0")
    assert found["inside"] >= 5 * PAGES


class RecordingLibc:
    """Stands in for glibc: records the mallopt calls."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def mallopt(self, param, value):
        self.calls.append((param, value.value))
        return 1

    def malloc_trim(self, pad):
        return 1


def test_inside_the_heap_is_never_trimmed(monkeypatch):
    """Found by bench/scale.py at 224x224: with a 1 GiB trim threshold glibc handed the heap's
    top back whenever a backward pass freed more than 1 GiB (PGD-10 on 128 images of
    small-resnet faulted 9,211 pages per image back in, none with trimming off; a heap's
    top is too dependent on its history for a reliable check in a test, so the settings are
    checked: -1, "never", is glibc's documented value, mallopt(3))."""
    libc = RecordingLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    with memory.reuse_freed_memory():
        inside = dict(libc.calls)
    assert inside == {memory._M_TRIM_THRESHOLD: -1, memory._M_MMAP_THRESHOLD: 1 << 30}
    assert dict(libc.calls)[memory._M_TRIM_THRESHOLD] == 64 << 20  # glibc's ceiling after


class InterruptedOnce:
    """Raises KeyboardInterrupt once, right after ``call`` has done its work: where CPython
    runs a signal handler (Ctrl-C, SIGTERM's ``terminate_as_interrupt``, a forward's SIGALRM)
    as a call returns."""

    def __init__(self, call):
        self.call, self.fired = call, False

    def __call__(self, *args):
        result = self.call(*args)
        if not self.fired:
            self.fired = True
            raise KeyboardInterrupt
        return result


class LockInterruptedOnRelease:
    """The module's lock, with a signal handler's exception as it is first released."""

    def __init__(self):
        self.lock = threading.Lock()
        self.release = InterruptedOnce(lambda: None)

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
        self.release()


def thresholds(calls: list[tuple[int, int]]) -> dict[int, int]:
    """The thresholds the recorded mallopt calls left set."""
    return dict(calls)


AFTER = {memory._M_TRIM_THRESHOLD: 64 << 20, memory._M_MMAP_THRESHOLD: 32 << 20}


def test_an_interruption_as_a_block_opens_leaves_none_open(monkeypatch):
    """Before session 17 the count went up outside the block's ``try``: a Ctrl-C as the
    lock was released left the block open for the life of the process (thresholds raised,
    never trimmed again; 138 of 3,000 SIGALRMs in a loop of empty blocks, 0 after)."""
    libc = RecordingLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    monkeypatch.setattr(memory, "_lock", LockInterruptedOnRelease())
    with pytest.raises(KeyboardInterrupt), memory.reuse_freed_memory():
        pass
    assert memory.open_blocks() == 0
    assert thresholds(libc.calls) == AFTER


@pytest.mark.parametrize("cut", ["raising", "restoring"])
def test_an_interruption_while_thresholds_are_set_leaves_them_restored(monkeypatch, cut):
    """A signal handler's exception as a mallopt call returns: on the way in (before
    session 17 the count had not gone up yet, so nothing restored them) or on the way out
    (the restore is run once more)."""
    libc = RecordingLibc()
    monkeypatch.setattr(memory, "_libc", lambda: libc)
    inside = memory.reuse_freed_memory()
    if cut == "raising":
        monkeypatch.setattr(libc, "mallopt", InterruptedOnce(libc.mallopt))
    with pytest.raises(KeyboardInterrupt), inside:
        if cut == "restoring":
            monkeypatch.setattr(libc, "mallopt", InterruptedOnce(libc.mallopt))
    assert memory.open_blocks() == 0
    assert thresholds(libc.calls) == AFTER
