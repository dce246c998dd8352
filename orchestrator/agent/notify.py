"""Webhook notifications from the agent: generic JSON, Slack, Feishu, DingTalk, WeCom.

Config (host config ``notify``): ``[{kind: slack, url_env: SLACK_WEBHOOK_URL, min_severity: warn,
secret_env: OPTIONAL_SIGNING_SECRET}]``. URLs and signing secrets are read at send time from the
box's secrets file (``gpurun secret set SLACK_WEBHOOK_URL --host H``, ``agent/secrets``) first,
then from the agent's environment, and never printed; payloads are redacted of every secret. Sends run on one background thread with a bounded queue and
bounded retries, so a dead endpoint never blocks the watchdog.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Dict, List, Optional

KINDS = ("generic", "slack", "feishu", "dingtalk", "wecom")
SEVERITY_RANK = {"info": 0, "warn": 1, "error": 2, "critical": 3}
ALWAYS = ("queue_done",)  # sent to every target whatever its min_severity
_KEYS = {"kind", "url_env", "min_severity", "secret_env", "name"}


def validate(targets: Any) -> List[Dict[str, Any]]:
    """Check the ``notify`` list; ``ValueError`` names the bad key (``notify[1].kind``)."""
    if targets is None:
        return []
    if not isinstance(targets, list):
        raise ValueError("notify: must be a list of {kind, url_env, min_severity}")
    out = []
    for i, t in enumerate(targets):
        where = "notify[%d]" % i
        if not isinstance(t, dict):
            raise ValueError("%s: must be a mapping" % where)
        extra = sorted(set(t) - _KEYS)
        if extra:
            raise ValueError("%s.%s: unknown key (known: %s)" % (where, extra[0], ", ".join(sorted(_KEYS))))
        if t.get("kind") not in KINDS:
            raise ValueError("%s.kind: %r is not one of %s" % (where, t.get("kind"), ", ".join(KINDS)))
        env = t.get("url_env")
        if not isinstance(env, str) or not env or "://" in env:
            raise ValueError("%s.url_env: give the NAME of an env var holding the webhook URL, not the URL" % where)
        sev = t.get("min_severity", "warn")
        if sev not in SEVERITY_RANK:
            raise ValueError("%s.min_severity: %r is not one of %s" % (where, sev, ", ".join(SEVERITY_RANK)))
        out.append(dict(t, min_severity=sev))
    return out


def wants(target: Dict[str, Any], event: Dict[str, Any]) -> bool:
    if event.get("kind") in ALWAYS:
        return True
    return SEVERITY_RANK.get(event.get("severity", "info"), 0) >= SEVERITY_RANK[target.get("min_severity", "warn")]


def text_of(event: Dict[str, Any]) -> str:
    host = event.get("host") or "gpurun"
    job = " job %s" % event["job_id"] if event.get("job_id") else ""
    return "[gpurun %s] %s%s: %s: %s" % (event.get("severity", "info").upper(), host, job,
                                         event.get("kind", "event"), event.get("message", ""))


def render(kind: str, event: Dict[str, Any], secret: Optional[str] = None,
           now: Optional[float] = None) -> tuple:
    """(body bytes, extra query string) in each service's documented message format."""
    text = text_of(event)
    query = ""
    if kind == "slack":
        body: Dict[str, Any] = {"text": text}
    elif kind == "feishu":
        body = {"msg_type": "text", "content": {"text": text}}
        if secret:  # Feishu: HMAC-SHA256 keyed by "timestamp\nsecret" over an empty message
            ts = str(int(now if now is not None else time.time()))
            mac = hmac.new(("%s\n%s" % (ts, secret)).encode(), b"", hashlib.sha256).digest()
            body.update(timestamp=ts, sign=base64.b64encode(mac).decode())
    elif kind == "dingtalk":
        body = {"msgtype": "text", "text": {"content": text}}
        if secret:  # DingTalk: HMAC-SHA256 keyed by secret over "timestamp_ms\nsecret", in the URL
            ts = str(int((now if now is not None else time.time()) * 1000))
            mac = hmac.new(secret.encode(), ("%s\n%s" % (ts, secret)).encode(), hashlib.sha256).digest()
            query = "timestamp=%s&sign=%s" % (ts, urllib.parse.quote_plus(base64.b64encode(mac).decode()))
    elif kind == "wecom":
        body = {"msgtype": "text", "text": {"content": text}}
    else:
        body = {"source": "gpurun", "text": text,
                **{k: event.get(k) for k in ("host", "kind", "severity", "job_id", "message", "data", "ts")}}
    return json.dumps(body, default=str).encode(), query


def _accepted(kind: str, status: int, payload: bytes) -> bool:
    """2xx, and for DingTalk/WeCom/Feishu also ``errcode``/``code`` 0 in the JSON reply."""
    if not 200 <= status < 300:
        return False
    if kind in ("dingtalk", "wecom", "feishu"):
        try:
            reply = json.loads(payload.decode("utf-8", "replace") or "{}")
        except ValueError:
            return True
        code = reply.get("errcode", reply.get("code", reply.get("StatusCode", 0)))
        return code in (0, None)
    return True


class Notifier:
    """Queues events and delivers them on a daemon thread. ``send`` never blocks or raises."""

    def __init__(self, targets: List[Dict[str, Any]], env: Optional[Dict[str, str]] = None, *,
                 retries: int = 3, backoff_s: float = 2.0, timeout_s: float = 10.0, max_queue: int = 200,
                 host: Optional[str] = None, state_dir: Optional[str] = None) -> None:
        self.targets = validate(targets)
        self.env = env if env is not None else os.environ
        self.state_dir = state_dir  # where ``gpurun secret set`` keeps the box's secrets
        self.retries, self.backoff_s, self.timeout_s = retries, backoff_s, timeout_s
        self.host = host
        self._q: "queue.Queue" = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self.results: List[Dict[str, Any]] = []  # drained by the caller (drain_results)
        self.stats = {"queued": 0, "sent": 0, "failed": 0, "dropped": 0}
        self._thread: Optional[threading.Thread] = None

    def send(self, event: Dict[str, Any]) -> int:
        """Queue ``event`` for every target that wants it; returns how many were queued."""
        n = 0
        event = dict(event, host=event.get("host") or self.host, ts=event.get("ts") or time.time())
        for t in self.targets:
            if not wants(t, event):
                continue
            try:
                self._q.put_nowait((t, event))
                n += 1
            except queue.Full:  # never block the watchdog: drop and count it
                with self._lock:
                    self.stats["dropped"] += 1
        if n:
            with self._lock:
                self.stats["queued"] += n
            self._start()
        return n

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="gpurun-notify", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            try:
                target, event = self._q.get(timeout=30)
            except queue.Empty:
                return  # idle: let the thread end; the next send starts a new one
            try:
                res = self._deliver(target, event)
            except Exception as exc:  # a bug here must not kill later deliveries
                res = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
            res.update(kind=target["kind"], url_env=target["url_env"], event_kind=event.get("kind"))
            with self._lock:
                self.stats["sent" if res["ok"] else "failed"] += 1
                self.results.append(res)
                del self.results[:-100]
            self._q.task_done()

    def lookup(self, name: str) -> Optional[str]:
        """A named value: the box's secret of that name first, then the environment."""
        if self.state_dir:
            from orchestrator.agent import secrets
            value = secrets.cached(self.state_dir).get(name)
            if value:
                return value
        return self.env.get(name) or None

    def _deliver(self, target: Dict[str, Any], event: Dict[str, Any]) -> Dict[str, Any]:
        url = self.lookup(target["url_env"])
        if not url:
            name = target["url_env"]
            return {"ok": False, "attempts": 0, "error": "env var %s is not set" % name if not self.state_dir else
                    "%s is not set: neither a secret on this host (`gpurun secret set %s`) nor an environment "
                    "variable of the agent" % (name, name)}
        secret = self.lookup(target["secret_env"]) if target.get("secret_env") else None
        if self.state_dir:  # no secret value leaves in a payload
            from orchestrator.agent import secrets
            masks = secrets.values(self.state_dir)
            if masks:
                event = secrets.redact_obj(event, masks)
        error = ""
        for attempt in range(1, self.retries + 1):
            body, query = render(target["kind"], event, secret)
            full = url + (("&" if "?" in url else "?") + query if query else "")
            req = urllib.request.Request(full, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "gpurun"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    if _accepted(target["kind"], resp.status, resp.read(65536)):
                        return {"ok": True, "attempts": attempt}
                    error = "HTTP %d but the service refused the message" % resp.status
            except urllib.error.HTTPError as exc:
                error = "HTTP %d" % exc.code
                if 400 <= exc.code < 500 and exc.code != 429:
                    break  # our message is wrong; retrying will not help
            except (urllib.error.URLError, OSError) as exc:  # reason text never contains the URL
                error = "connection failed: %s" % getattr(exc, "reason", exc)
            if attempt < self.retries:
                time.sleep(self.backoff_s * (2 ** (attempt - 1)))
        return {"ok": False, "attempts": attempt, "error": error}

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until the queue is empty (tests, shutdown); True if it drained in time."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._q.unfinished_tasks == 0:
                return True
            time.sleep(0.02)
        return False

    def drain_results(self) -> List[Dict[str, Any]]:
        with self._lock:
            out, self.results = self.results, []
        return out


_CACHE: Dict[str, Notifier] = {}


def notifier_for(key: str, config: Dict[str, Any], **kw: Any) -> Optional[Notifier]:
    """One long-lived notifier per state dir and config (so retries outlive a tick)."""
    targets = (config or {}).get("notify") or []
    if not targets:
        return None
    sig = key + json.dumps(targets, sort_keys=True)
    n = _CACHE.get(sig)
    if n is None:
        n = _CACHE[sig] = Notifier(targets, host=(config or {}).get("host") or (config or {}).get("name"), **kw)
    return n
