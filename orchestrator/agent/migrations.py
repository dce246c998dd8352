"""Schema versions of the agent's SQLite store, and the one path that brings a file up to date.

A box's ``gpurun.db`` outlives every agent upgrade: each new agent restarts against the file
the old one wrote, while the old one's jobs keep running. So the schema only ever grows, one
numbered migration at a time, and the version lives in the file (``PRAGMA user_version``):

* version 0: a file with no schema yet (fresh), or one written before versioning existed,
  which has the version-1 tables already (its ``CREATE ... IF NOT EXISTS`` keep them as is);
* every migration is add-only (new tables, new nullable columns, backfills of new columns),
  so an older agent still running against a migrated file keeps working;
* a fresh file takes the same path as an old one, so the two can never drift apart;
* a file newer than this agent knows is refused before anything is written to it.

All pending migrations run in one ``BEGIN IMMEDIATE`` transaction: two processes opening an
old file at once serialize on the write lock, and the second finds the work done. Opening a
current file costs one ``PRAGMA user_version`` read.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import List, Tuple

# (version, what it adds, statements). Append only; never edit a released migration.
MIGRATIONS: List[Tuple[int, str, List[str]]] = [
    (1, "jobs, events and kv: the schema of every agent before versioning", [
        """CREATE TABLE IF NOT EXISTS jobs (
          seq INTEGER PRIMARY KEY AUTOINCREMENT,
          id TEXT NOT NULL UNIQUE,
          name TEXT NOT NULL,
          command TEXT NOT NULL,
          cwd TEXT,
          env TEXT NOT NULL DEFAULT '{}',
          gpus INTEGER NOT NULL DEFAULT 0,
          gpu_ids TEXT NOT NULL DEFAULT '[]',
          retries INTEGER NOT NULL DEFAULT 0,
          timeout_s REAL,
          metrics TEXT,
          checkpoints TEXT,
          state TEXT NOT NULL DEFAULT 'queued',
          attempt INTEGER NOT NULL DEFAULT 0,
          attempt_base INTEGER NOT NULL DEFAULT 0,
          exit_code INTEGER,
          pid INTEGER,
          boot_id TEXT,
          run_dir TEXT NOT NULL,
          log TEXT NOT NULL,
          cancel_requested INTEGER NOT NULL DEFAULT 0,
          force_resume INTEGER NOT NULL DEFAULT 0,
          reason TEXT,
          source TEXT,
          submitted_at REAL NOT NULL,
          started_at REAL,
          ended_at REAL
        )""",
        "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state)",
        """CREATE TABLE IF NOT EXISTS events (
          id INTEGER PRIMARY KEY AUTOINCREMENT,
          ts REAL NOT NULL,
          job_id TEXT,
          kind TEXT NOT NULL,
          severity TEXT NOT NULL,
          message TEXT NOT NULL,
          data TEXT
        )""",
        "CREATE INDEX IF NOT EXISTS events_job ON events(job_id)",
        "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]),
    (2, "jobs.stop_cause: why a job was asked to stop (quality, watchdog, user, timeout, ...)", [
        "ALTER TABLE jobs ADD COLUMN stop_cause TEXT",
        # Backfill from the free-text rules the runner used before this column existed, so a
        # stop requested by the old agent and settled by the new one (jobs outlive the
        # daemon across an upgrade) still ends in the same state. Queued rows have no cause.
        """UPDATE jobs SET stop_cause = CASE
             WHEN state = 'quality_stopped' OR reason LIKE 'stopped by quality check%' THEN 'quality'
             WHEN (cancel_requested = 1 OR state = 'cancelled') AND reason LIKE 'watchdog%' THEN 'watchdog'
             WHEN cancel_requested = 1 OR state = 'cancelled' THEN 'user'
             WHEN reason LIKE 'watchdog requeue%' THEN 'watchdog_requeue'
             WHEN reason LIKE 'timeout after%' THEN 'timeout'
           END
           WHERE state NOT IN ('queued', 'succeeded')""",
    ]),
    (3, "jobs.secrets: the NAMES (JSON list) of the box's secrets exported to the job at launch", [
        "ALTER TABLE jobs ADD COLUMN secrets TEXT",
    ]),
    (4, "jobs_queued_cancel: the queued jobs being cancelled, found without reading the queue", [
        # The runner looks for these on every pass, also when the host is full; through the
        # plain state index that read every queued row (O(backlog) per job start). Queued
        # jobs in order need no new index: ``jobs_state`` is (state, rowid) and seq is rowid.
        "CREATE INDEX IF NOT EXISTS jobs_queued_cancel ON jobs(seq) WHERE state = 'queued' AND cancel_requested = 1",
    ]),
    (5, "jobs.quality (the latest verdict, JSON) and jobs.failure_class/failure_hint (why an attempt ended)", [
        # quality: {"verdict", "reason", "step", "checked_at", "rule", "final", ...} written by the
        # quality check on every verdict; failure_class: a stable word from agent/failures
        # (cuda_oom, host_oom, disk_full, nccl_timeout, ...) set when an attempt ends.
        "ALTER TABLE jobs ADD COLUMN quality TEXT",
        "ALTER TABLE jobs ADD COLUMN failure_class TEXT",
        "ALTER TABLE jobs ADD COLUMN failure_hint TEXT",
    ]),
    (6, "jobs.moved_to (the fleet host a queued job was released to) and jobs.backend_id (the scheduler's job id)", [
        # moved_to: set with the queued -> moved compare-and-set of the `release` verb (a fleet
        # rebalance); backend_id: the id a batch scheduler gave the job (Slurm's job id), on
        # hosts where the scheduler, not the daemon, runs the queue.
        "ALTER TABLE jobs ADD COLUMN moved_to TEXT",
        "ALTER TABLE jobs ADD COLUMN backend_id TEXT",
    ]),
]

LATEST = MIGRATIONS[-1][0]


class StoreTooNew(Exception):
    """The database was written by a newer agent than this one; it is left untouched.

    ``kind`` and ``hint`` make the verb dispatch answer with a framed error of kind
    ``store_too_new`` (the agent protocol's name for it) instead of a traceback."""

    kind = "store_too_new"

    def __init__(self, found: int, known: int, path: str = ""):
        self.found = found
        self.known = known
        self.hint = ("the newer agent's database was left untouched; upgrade the gpurun that manages this box "
                     "(`pip install -U gpurun`), then run the command again")
        where = " (%s)" % path if path else ""
        super().__init__("this box's state%s was written by a newer gpurun agent (schema %d, this agent knows %d); "
                         "upgrade gpurun on this machine" % (where, found, known))


def version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def refuse_if_too_new(path: str) -> None:
    """Raise ``StoreTooNew`` when the file at ``path`` was written by a newer agent; reads only
    and creates nothing. For whoever is about to start or replace the daemon: check first, so
    an older agent never stops a newer one and then fails to start in its place."""
    if not os.path.exists(path):
        return
    db = sqlite3.connect(path, timeout=30.0)
    try:
        found = version(db)
    finally:
        db.close()
    if found > LATEST:
        raise StoreTooNew(found, LATEST, path)


def _use_wal(db: sqlite3.Connection, wait_s: float = 30.0) -> None:
    """Switch to WAL (a no-op on boxes already in it). Only possible outside a transaction,
    and SQLite answers "locked" at once, without the busy handler, while another process
    holds the fresh file: so wait here, as the busy timeout would."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(0.005)


def ensure_current(db: sqlite3.Connection, path: str = "") -> int:
    """Bring ``db`` (autocommit connection, busy timeout set) to ``LATEST``; returns the
    version it was found at. Raises ``StoreTooNew``, having written nothing, for a newer file."""
    found = version(db)
    if found == LATEST:
        return found  # the common case: one header read
    if found > LATEST:
        raise StoreTooNew(found, LATEST, path)
    _use_wal(db)
    db.execute("BEGIN IMMEDIATE")
    try:
        found = version(db)  # re-read under the write lock: another process may have migrated
        if found > LATEST:
            raise StoreTooNew(found, LATEST, path)
        for number, _what, statements in MIGRATIONS:
            if number > found:
                for stmt in statements:
                    db.execute(stmt)  # not executescript: it would COMMIT mid-transaction
        if found < LATEST:
            db.execute("PRAGMA user_version=%d" % LATEST)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return found
