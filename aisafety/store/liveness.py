"""Which 'running' runs are still alive: a heartbeat (a lease) and the same-host pid check.

A run killed with kill -9, or whose machine lost power, cannot mark itself. Each run records
its host and pid, and while it runs a background thread renews ``runs.heartbeat_at`` every
``HEARTBEAT_S`` seconds. The next run that starts, on any host sharing the database, marks
as 'interrupted' every 'running' run whose heartbeat is older than ``STALE_AFTER_S`` (the
lease: ten missed beats, so a busy database or a paused process is not taken for dead), and
at once those of its own host whose process is gone. Runs written before the heartbeat
existed (``heartbeat_at`` NULL) get only the pid check.

Times are naive UTC written and compared by this module only, so SQLite (which keeps no time
zone) and PostgreSQL (whose session time zone may be anything) agree.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from aisafety.store import schema

log = logging.getLogger(__name__)

HEARTBEAT_S = 60.0  # how often a running run renews its lease
STALE_AFTER_S = 600.0  # a 'running' run without a heartbeat for this long is taken as dead


def utc_now() -> datetime:
    """Naive UTC (see the module docstring)."""
    return datetime.now(UTC).replace(tzinfo=None)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    return True


def mark_dead_runs(session: Session) -> list[int]:
    """Mark 'running' runs whose lease ran out (any host) or whose process is gone (this
    host) as 'interrupted'; returns their ids."""
    host, cutoff = socket.gethostname(), utc_now() - timedelta(seconds=STALE_AFTER_S)
    dead = []
    for run in session.scalars(select(schema.Run).where(schema.Run.status == "running")):
        if run.host == host and run.pid == os.getpid():
            continue  # a run of this very process
        gone = run.host == host and run.pid is not None and not process_alive(run.pid)
        expired = run.heartbeat_at is not None and run.heartbeat_at < cutoff
        if gone or expired:
            run.status = "interrupted"
            dead.append(run.id)
    return dead


class Heartbeat:
    """Renews one run's lease from a daemon thread until ``stop()``; a failed beat is logged
    and retried at the next one (it never stops the run)."""

    def __init__(self, engine: Engine, run_id: int, every: float | None = None):
        self.engine, self.run_id = engine, run_id
        self.every = HEARTBEAT_S if every is None else every
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._beat_until_stopped, name=f"aisafety-heartbeat-{run_id}", daemon=True
        )
        self._thread.start()

    def beat(self) -> None:
        with Session(self.engine) as session, session.begin():
            session.execute(
                update(schema.Run)
                .where(schema.Run.id == self.run_id, schema.Run.status == "running")
                .values(heartbeat_at=utc_now())
            )

    def _beat_until_stopped(self) -> None:
        while not self._stopped.wait(self.every):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a missed beat must not end the run
                log.warning("heartbeat of run %s failed: %s", self.run_id, exc)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=self.every + 5)
