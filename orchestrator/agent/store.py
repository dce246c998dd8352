"""The agent's durable store: jobs, events and a small key-value table in SQLite (WAL).

Every state change is one compare-and-set UPDATE (``transition``), so two writers can never
both move a job, and a late writer never moves a finished job back. Client verbs only insert
queued rows or set the cancel flag; the runner owns ``running`` and the terminal states.
The schema and its versions live in ``migrations``: opening a Store brings an older file up to
date and refuses one written by a newer agent (``StoreTooNew``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from typing import Any, Iterable, Optional

from orchestrator.agent import states as S
from orchestrator.agent.secrets import redact, redact_obj
from orchestrator.agent.secrets import values as secret_values
from orchestrator.agent.migrations import LATEST as SCHEMA_VERSION  # noqa: F401  (re-exported)
from orchestrator.agent.migrations import StoreTooNew, ensure_current  # noqa: F401  (StoreTooNew re-exported)

JSON_COLS = ("env", "gpu_ids", "secrets", "quality")
_EMPTY: dict = {"env": {}, "gpu_ids": [], "secrets": [], "quality": None}  # a NULL column read back
_EMPTY_TEXT = {"{}": dict, "[]": list}
# what ``queue status`` shows as a table (``cli/render``): the wire job less its paths, command,
# env and hints, which were ~3/4 of a 50,000-job reply and of its decoding on both ends
TABLE_COLS = ("id", "seq", "name", "state", "exit_code", "attempt", "gpus", "gpu_ids", "reason",
              "failure_class", "quality", "started_at", "ended_at")
_GPU_IDS, _QUALITY = TABLE_COLS.index("gpu_ids"), TABLE_COLS.index("quality")
SEVERITIES = ("info", "warn", "error", "critical")
EVENT_FIELDS = ("exit_code", "attempt", "reason", "stop_cause")  # copied into a state event's data


class Store:
    """One SQLite file per host. Safe to open from many processes at once."""

    def __init__(self, path: str):
        """Open (creating or migrating as needed, see ``migrations``); raises ``StoreTooNew``,
        having written nothing, when a newer agent wrote the file."""
        self.path = path
        self.db = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        try:
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA busy_timeout=30000")
            ensure_current(self.db, path)
            self.db.execute("PRAGMA synchronous=NORMAL")
        except BaseException:
            self.db.close()
            raise

    def close(self) -> None:
        self.db.close()

    def _masks(self) -> list:
        """The box's secret values to keep out of the events (``agent/secrets``: one stat
        when unchanged, nothing more when no secret is set). In-memory stores have none."""
        if self.path == ":memory:":
            return []
        return secret_values(os.path.dirname(os.path.abspath(self.path)))

    # --- jobs ------------------------------------------------------------------------
    @staticmethod
    def _row(row: sqlite3.Row) -> dict:
        d = dict(row)
        for col in JSON_COLS:
            v = d.get(col)
            # '{}' and '[]' are most rows' env and gpu_ids: a fresh empty value, no decoder call
            d[col] = (json.loads(v) if v not in _EMPTY_TEXT else _EMPTY_TEXT[v]()) if v else _EMPTY.get(col)
        d["cancel_requested"] = bool(d["cancel_requested"])
        d["force_resume"] = bool(d["force_resume"])
        return d

    def insert_jobs(self, jobs: Iterable[dict]) -> tuple[list[str], list[str]]:
        """Insert queued jobs in one transaction; returns (added ids, already-present ids).

        A job moved from a lost box (``gpurun recover``) carries its ``attempt`` count, so its
        next start is a resume (attempt > 0) and passes the quality gate first; the retry
        budget starts fresh there (``attempt_base``)."""
        now = time.time()
        jobs = list(jobs)
        added: list[str] = []
        present: list[str] = []
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            # Known ids are looked up first, inside the write lock: an ``INSERT OR IGNORE`` of a
            # present id still consumes an AUTOINCREMENT number, so a no-op resubmit of 8 jobs
            # used to make the next new job #17 instead of #9.
            known = self._present_ids(cur, [j["id"] for j in jobs])
            rows = []
            back: list[str] = []
            for j in jobs:
                if known.get(j["id"]) == S.MOVED and j["id"] not in back:
                    # a job released to another fleet host and now placed here again: it
                    # lives here once more (the rebalance released it there first)
                    cur.execute("UPDATE jobs SET state=?, moved_to=NULL, reason=?, attempt=MAX(attempt, ?),"
                                " attempt_base=MAX(attempt_base, ?) WHERE id=? AND state=?",
                                (S.QUEUED, "placed here again", int(j.get("attempt") or 0),
                                 int(j.get("attempt") or 0), j["id"], S.MOVED))
                    back.append(j["id"])
                    added.append(j["id"])
                    continue
                if j["id"] in known:
                    present.append(j["id"])
                    continue
                known[j["id"]] = S.QUEUED  # the same id twice in one request is added once
                added.append(j["id"])
                rows.append((j["id"], j["name"], j["command"], j.get("cwd"), json.dumps(j.get("env") or {}),
                             int(j.get("gpus") or 0), int(j.get("retries") or 0), j.get("timeout_s"),
                             j.get("metrics"), j.get("checkpoints"), j["run_dir"], j["log"],
                             j.get("source"), now, int(j.get("attempt") or 0), int(j.get("attempt") or 0),
                             json.dumps(list(j["secrets"])) if j.get("secrets") else None))
            cur.executemany(
                "INSERT INTO jobs (id, name, command, cwd, env, gpus, retries, timeout_s,"
                " metrics, checkpoints, run_dir, log, source, submitted_at, attempt, attempt_base, secrets)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            cur.execute("COMMIT")
            for jid in back:
                self.add_event(jid, "state", "info", "moved -> queued", {"to": S.QUEUED, "reason": "placed here again"})
        except BaseException:
            # SQLite rolls back by itself after some errors ("database or disk is full"): a
            # second ROLLBACK would raise "no transaction is active" and hide the real error
            if self.db.in_transaction:
                cur.execute("ROLLBACK")
            raise
        return added, present

    @staticmethod
    def _present_ids(cur: sqlite3.Cursor, ids: list) -> dict:
        """Which of ``ids`` the jobs table already holds, with their states (in chunks: old
        SQLite builds allow only 999 bound variables per statement)."""
        found: dict = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            q = "SELECT id, state FROM jobs WHERE id IN (%s)" % ",".join("?" * len(chunk))
            found.update((r[0], r[1]) for r in cur.execute(q, chunk).fetchall())
        return found

    def jobs(self, states: Optional[Iterable[str]] = None) -> list[dict]:
        if states is None:
            rows = self.db.execute("SELECT * FROM jobs ORDER BY seq").fetchall()
        else:
            st = list(states)
            q = "SELECT * FROM jobs WHERE state IN (%s) ORDER BY seq" % ",".join("?" * len(st))
            rows = self.db.execute(q, st).fetchall()
        return [self._row(r) for r in rows]

    def table_rows(self) -> list[dict]:
        """Every job, in submission order, as ``TABLE_COLS`` only (``status`` for a table):
        plain tuples from SQLite, and JSON decoded only where a column holds more than ``[]``."""
        cur = self.db.cursor()
        cur.row_factory = None
        rows = cur.execute("SELECT %s FROM jobs ORDER BY seq" % ", ".join(TABLE_COLS)).fetchall()
        loads, cols = json.loads, TABLE_COLS
        out = []
        for r in rows:
            d = dict(zip(cols, r))
            g, q = r[_GPU_IDS], r[_QUALITY]
            d["gpu_ids"] = loads(g) if g and g != "[]" else []
            if q:
                d["quality"] = loads(q)
            out.append(d)
        return out

    def count_states(self, states: Iterable[str]) -> dict:
        """``{state: number of jobs}`` for ``states`` (0 when none): one indexed query."""
        st = list(states)
        out = {s: 0 for s in st}
        q = "SELECT state, COUNT(*) FROM jobs WHERE state IN (%s) GROUP BY state" % ",".join("?" * len(st))
        for state, n in self.db.execute(q, st).fetchall():
            out[state] = int(n)
        return out

    def queued_cancelled(self) -> list[dict]:
        """Queued jobs with the cancel flag set: through a partial index (named: the planner
        would pick the plain state index, which reads every queued row), so the cost is the
        number of such jobs, never the backlog's."""
        rows = self.db.execute("SELECT * FROM jobs INDEXED BY jobs_queued_cancel"
                               " WHERE state='queued' AND cancel_requested=1 ORDER BY seq")
        return [self._row(r) for r in rows.fetchall()]

    def state_counts(self) -> dict:
        """``{state: number of jobs}`` from the state index alone: no row is read or decoded."""
        return dict(self.db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall())

    def judged_stop(self) -> list[dict]:
        """Finished jobs whose recorded quality verdict is STOP (``quality_cadence``): a LIKE
        picks the candidates (no JSON1 needed on old SQLite builds), their JSON decides."""
        q = "SELECT id, name, quality FROM jobs WHERE quality LIKE ? AND state IN (%s) ORDER BY seq"
        rows = self.db.execute(q % ",".join("?" * len(S.TERMINAL)), ['%"STOP"%'] + sorted(S.TERMINAL)).fetchall()
        return [{"id": r[0], "name": r[1], "quality": json.loads(r[2])} for r in rows
                if (json.loads(r[2]) or {}).get("verdict") == "STOP"]

    def queued_page(self, limit: int, after_seq: int = 0) -> list[dict]:
        """The next ``limit`` queued jobs in submission order after ``after_seq``: an index
        range read (``jobs_state`` is (state, rowid) and seq is the rowid), whatever the
        backlog behind them."""
        rows = self.db.execute("SELECT * FROM jobs WHERE state='queued' AND seq>? ORDER BY seq LIMIT ?",
                               (int(after_seq), int(limit)))
        return [self._row(r) for r in rows.fetchall()]

    def backend_jobs(self, ended_since: float) -> list[dict]:
        """Jobs a batch scheduler runs (``backend_id`` set) that are active or ended after
        ``ended_since``: what a Slurm host reconciles (``agent/slurm_reconcile``)."""
        rows = self.db.execute("SELECT * FROM jobs WHERE backend_id IS NOT NULL AND (state IN ('queued', 'running')"
                               " OR ended_at > ?) ORDER BY seq", (float(ended_since),))
        return [self._row(r) for r in rows.fetchall()]

    def get_job(self, ref: Any) -> Optional[dict]:
        """Find a job by id, by exact name, or by its number (``seq``)."""
        ref = str(ref)
        row = self.db.execute("SELECT * FROM jobs WHERE id=?", (ref,)).fetchone()
        if row is None:
            row = self.db.execute("SELECT * FROM jobs WHERE name=? ORDER BY seq DESC", (ref,)).fetchone()
        if row is None and ref.lstrip("#").isdigit():
            row = self.db.execute("SELECT * FROM jobs WHERE seq=?", (int(ref.lstrip("#")),)).fetchone()
        return self._row(row) if row is not None else None

    def transition(self, job_id: str, from_states: Iterable[str], to_state: str,
                   *, user_retry: bool = False, release: bool = False, **fields: Any) -> bool:
        """Compare-and-set: move ``job_id`` to ``to_state`` only if it is in ``from_states``.

        A queued job has no stop cause: moving one back to the queue (retry, requeue) clears
        ``stop_cause`` unless the caller sets it, so a stale cause never ends the next attempt."""
        if to_state == S.QUEUED:
            fields.setdefault("stop_cause", None)
        srcs = [s for s in from_states if S.allowed(s, to_state, user_retry=user_retry, release=release)]
        if not srcs:
            return False
        sets = ["state=?"]
        vals: list[Any] = [to_state]
        fields = self._redacted(fields)
        for k, v in fields.items():
            sets.append("%s=?" % k)
            vals.append(json.dumps(v) if k in JSON_COLS else v)
        q = "UPDATE jobs SET %s WHERE id=? AND state IN (%s)" % (", ".join(sets), ",".join("?" * len(srcs)))
        cur = self.db.execute(q, vals + [job_id] + srcs)
        ok = cur.rowcount == 1
        if ok:
            self.add_event(job_id, "state", "info", "%s -> %s" % ("|".join(srcs), to_state),
                           {"to": to_state, **{k: v for k, v in fields.items() if k in EVENT_FIELDS}})
        return ok

    def update_fields(self, job_id: str, in_states: Iterable[str], **fields: Any) -> bool:
        """Set non-state fields (pid, cancel flag) only while the job is in ``in_states``."""
        st = list(in_states)
        fields = self._redacted(fields)
        sets = ", ".join("%s=?" % k for k in fields)
        vals = [json.dumps(v) if k in JSON_COLS else v for k, v in fields.items()]
        q = "UPDATE jobs SET %s WHERE id=? AND state IN (%s)" % (sets, ",".join("?" * len(st)))
        return self.db.execute(q, vals + [job_id] + st).rowcount == 1

    def _redacted(self, fields: dict) -> dict:
        """``fields`` with every known secret value in a text as ``***``: a job's ``reason`` and
        ``failure_hint`` quote its own log (``agent/failures``), which may print a secret, and
        the job rows keep none (``agent/secrets``)."""
        masks = self._masks() if any(isinstance(v, str) for v in fields.values()) else []
        return {k: redact(v, masks) if masks and isinstance(v, str) else v for k, v in fields.items()}

    # --- events ----------------------------------------------------------------------
    def add_event(self, job_id: Optional[str], kind: str, severity: str, message: str,
                  data: Optional[dict] = None) -> int:
        """Record an event; a known secret value in ``message`` or ``data`` is stored as ``***``."""
        if severity not in SEVERITIES:
            severity = "info"
        masks = self._masks()
        if masks:
            message = redact(message, masks)
            data = redact_obj(data, masks) if data else data
        cur = self.db.execute(
            "INSERT INTO events (ts, job_id, kind, severity, message, data) VALUES (?,?,?,?,?,?)",
            (time.time(), job_id, kind, severity, message, json.dumps(data, default=str) if data else None))
        return int(cur.lastrowid)

    def last_event_id(self, kind: str) -> int:
        """Id of the newest event of ``kind`` (0 when none): read from the end, so cheap."""
        row = self.db.execute("SELECT id FROM events WHERE kind=? ORDER BY id DESC LIMIT 1", (kind,)).fetchone()
        return int(row[0]) if row else 0

    def events(self, since_id: int = 0, job_id: Optional[str] = None, limit: int = 1000,
               newest: bool = False) -> list[dict]:
        """Events after ``since_id``, oldest first: the first ``limit`` of them, or with
        ``newest`` the last ``limit``."""
        where, args = "id>?", [since_id]
        if job_id is not None:
            where, args = where + " AND job_id=?", args + [job_id]
        order = "DESC" if newest else "ASC"
        rows = self.db.execute("SELECT * FROM events WHERE %s ORDER BY id %s LIMIT ?" % (where, order),
                               args + [limit]).fetchall()
        if newest:
            rows.reverse()
        out = []
        for r in rows:
            d = dict(r)
            d["data"] = json.loads(d["data"]) if d["data"] else {}
            out.append(d)
        return out

    # --- kv ----------------------------------------------------------------------------
    def kv_get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def kv_set(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, json.dumps(value, default=str)))
