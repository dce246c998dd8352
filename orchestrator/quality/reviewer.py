"""The reviewer: a stronger model asked for STOP / CONTINUE / WAIT, only when the judge is unsure.

Two kinds, both asked only for an *ambiguous* verdict (``ambiguity``, the one definition):

* an OpenAI-compatible chat-completions endpoint (``quality.reviewer: {base_url, model,
  key_env, timeout_s}``, or ``gpurun check --reviewer-url/--reviewer-model/--reviewer-key-env``):
  ``POST {base_url}/chat/completions`` with the seed workflow's prompt (``build_prompt``);
* a shell command (``quality.reviewer_command`` / ``gpurun check --reviewer CMD``) that reads a
  JSON summary (``review_payload``) on stdin and prints the word.

The answer, when asked, is the verdict: exactly one of STOP / CONTINUE / WAIT (``parse_answer``);
anything else, a timeout, a refused connection, HTTP 429/5xx, a malformed body or a missing key is
WAIT with the reason recorded: never STOP on an error. The key is read through a lookup the caller
passes (the agent: its secrets file, then the environment; the controller: the environment) and
goes into the ``Authorization`` header only: not the verdict, the evidence, an event, an error.
Stdlib only (ships to the box), Python >= 3.8.
"""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from typing import List, Optional, Tuple

ANSWERS = ("STOP", "CONTINUE", "WAIT")
MAX_TOKENS = 16
DEFAULT_TIMEOUT_S = 60.0
SETTINGS = ("base_url", "model", "key_env", "timeout_s")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*$")

# Findings that make a verdict ambiguous (the seed's "Unsure" rows), with the question they pose.
#   flat but not diverging:  no_learning (even at STOP: a flat loss is a judgment call), frozen
#   noisy, no clear trend:   spike (not yet recovered or not), divergence at warn level (up, but
#                            below the STOP ratio or not confirmed), eval_regression at warn level
#   slightly worse than the baseline but early: below_baseline at warn level, before half the run;
#   a sign, a return's fall the log cannot settle: negative_loss, return_collapse (warn)
AMBIGUOUS = {"no_learning": "flat", "frozen": "flat", "flat_start": "flat", "spike": "noisy", "divergence": "noisy",
             "level_shift": "noisy", "divergence_best": "noisy", "eval_regression": "noisy",
             "below_baseline": "baseline", "short_ended": "short", "negative_loss": "sign", "return_collapse": "return"}
AMBIGUOUS_STOP = ("no_learning",)  # the only STOP a reviewer may overrule: flat, nothing broken
CLEAR_BAD = ("nonfinite_loss", "loss_collapse")  # any severity: NaN/Inf or a zero loss is never unsure
EARLY = 0.5  # "early": before this fraction of the planned steps (or the plan is unknown)
QUESTION = {"flat": "the loss is flat but not diverging: a plateau, or no learning at all?",
            "noisy": "the metrics are noisy and the trend is unclear",
            "baseline": "slightly worse than the declared baseline, but the run is still early",
            "sign": "the loss went below 0: a log-density's (fine) or a sign error's?",
            "return": "the episode return fell back to its start after it had learned: a collapse or a long dip?",
            "short": "the run has ended after too few logged points for the rule-based trend tests: judge it "
                     "from the values shown, failed or fine?"}
SHORT_MIN = 2  # an ended run this short asks: its "too few points" WAIT cannot resolve by waiting


def ambiguity(verdict: dict, planned_steps: Optional[float] = None, min_points: int = 13) -> Optional[dict]:
    """The finding that makes ``verdict`` (a judge result) ambiguous, or None when it is clear.

    Clear: any STOP but ``no_learning``, a non-finite or collapsed loss, unreadable metrics, no
    warn/stop finding (``info`` never asks), too little data: a finding is judged on its own
    series' points or the loss's (``judge`` notes them; 40 evals beside 5 loss logs are enough).
    Ambiguous: ``AMBIGUOUS``' findings (a warn-level ``below_baseline`` only before half the
    planned steps), and an ended run too short for the trend rules (``short_ended``)."""
    if verdict.get("unreadable"):
        return None
    findings = verdict.get("findings") or []
    for f in findings:
        if f.get("code") in CLEAR_BAD and f.get("severity") in ("warn", "stop"):
            return None
        if f.get("severity") == "stop" and f.get("code") not in AMBIGUOUS_STOP:
            return None
    points = int(verdict.get("points") or 0)
    enough = [f for f in findings if max(points, f.get("points") or 0) >= min_points]
    if points < min_points and not enough:
        if verdict.get("final") and points >= SHORT_MIN and verdict.get("verdict") == "WAIT":
            return {"code": "short_ended", "severity": "warn", "step": verdict.get("last_step"), "series": "",
                    "evidence": {"points": points, "needed": min_points}, "hint": ""}
        return None
    last = verdict.get("last_step")
    early = not planned_steps or not isinstance(last, (int, float)) or last < EARLY * planned_steps
    for f in enough:
        code, sev = f.get("code"), f.get("severity")
        if code not in AMBIGUOUS or sev not in ("warn", "stop"):
            continue
        if sev == "stop" and code not in AMBIGUOUS_STOP:
            continue
        if code == "below_baseline" and not early:
            continue
        return f
    return None


# A run in doubt is checked each minute: asking each time bills ~60 questions an hour for one doubt.
# An answer stands for its doubt until the loss grows by a quarter (10 points at least) or an hour passes.
REASK_GROWTH, REASK_MIN_POINTS, REASK_AFTER_S = 0.25, 10, 3600.0


def memo(rec: Optional[dict], points: int, now: float) -> Optional[dict]:
    """What a check keeps of a review it just had answered, for the next checks (else None)."""
    if not rec or not rec.get("answered") or rec.get("reused"):
        return None
    return {"in_doubt": rec.get("in_doubt"), "answer": rec.get("answer"), "note": rec.get("note") or "",
            "points": int(points), "at": float(now)}


def standing(m: Optional[dict], doubt: dict, points: int, now: float) -> Optional[int]:
    """The loss points at which ``m``'s answer stops standing for ``doubt``; None if it does not now."""
    if not isinstance(m, dict) or m.get("in_doubt") != doubt.get("code"):
        return None
    try:
        at_points, age = int(m["points"]), now - float(m["at"])
    except (KeyError, TypeError, ValueError):
        return None
    until = at_points + max(REASK_MIN_POINTS, int(math.ceil(REASK_GROWTH * at_points)))
    return until if points < until and 0 <= age < REASK_AFTER_S else None


# --- settings -------------------------------------------------------------------------------

def settings(obj) -> Optional[dict]:
    """Checked reviewer settings ``{base_url, model, key_env, timeout_s}`` (names only, never a
    key), or None for none. Raises ValueError naming the bad field."""
    if not obj:
        return None
    if not isinstance(obj, dict):
        raise ValueError("quality.reviewer: expected {base_url, model, key_env, timeout_s}")
    extra = sorted(set(obj) - set(SETTINGS))
    if extra:
        raise ValueError("quality.reviewer: unknown key %s (known: %s)" % (extra[0], ", ".join(SETTINGS)))
    url = str(obj.get("base_url") or "").strip()
    if not re.match(r"https?://\S+$", url):
        raise ValueError("quality.reviewer.base_url %r: expected an http(s):// URL such as "
                         "https://api.openai.com/v1" % url)
    model = str(obj.get("model") or "").strip()
    if not model:
        raise ValueError("quality.reviewer.model: the model name is missing")
    key_env = obj.get("key_env")
    if key_env is not None and (not isinstance(key_env, str) or not _ENV_NAME.match(key_env)):
        raise ValueError("quality.reviewer.key_env: expected a NAME such as OPENAI_API_KEY (the key "
                         "itself goes in a secret or the environment, never in the settings)")
    try:
        timeout = float(obj.get("timeout_s") or DEFAULT_TIMEOUT_S)
    except (TypeError, ValueError):
        raise ValueError("quality.reviewer.timeout_s: expected seconds")
    if not timeout > 0:
        raise ValueError("quality.reviewer.timeout_s: expected seconds > 0")
    return {"base_url": url.rstrip("/"), "model": model, "key_env": key_env or None, "timeout_s": timeout}


# --- the question ---------------------------------------------------------------------------

def _n(x):
    return int(x) if isinstance(x, float) and x.is_integer() else x


def _fmt(v) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return "%.6g" % v if isinstance(v, (int, float)) else str(v)


def _j(v):
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


def _pairs(s, n: int) -> str:
    return ", ".join("%s: %s" % (_fmt(_n(a)), _fmt(b)) for a, b in zip(s.steps[-n:], s.values[-n:]))


def _evals(run) -> List[str]:
    out = []
    for name in sorted(run.series):
        if name.startswith(("eval_", "val_")) and len(run.series[name]):
            out.append("%s [%s]" % (name, _pairs(run.series[name], 3)))
    return out[:6]


def _baseline(opts: dict, last_step) -> Optional[str]:
    base = opts.get("baseline")
    if not base:
        return None
    bits = []
    for name in sorted(base):
        b = base[name]
        if isinstance(b, dict) and b:
            steps = sorted(b)
            here = [k for k in steps if isinstance(last_step, (int, float)) and k <= last_step]
            at = here[-1] if here else steps[0]
            bits.append("%s %s at step %s (reference run; %s at its last step %s)"
                        % (name, _fmt(b[at]), _fmt(_n(at)), _fmt(b[steps[-1]]), _fmt(_n(steps[-1]))))
        elif isinstance(b, (int, float)):
            bits.append("%s %s" % (name, _fmt(b)))
    return "; ".join(bits[:6]) or None


def _doubt_text(doubt: dict, verdict: dict) -> str:
    ev = doubt.get("evidence") or {}
    facts = ", ".join("%s=%s" % (k, _fmt(v)) for k, v in list(ev.items())[:6] if not isinstance(v, (dict, list)))
    kind = QUESTION[AMBIGUOUS[str(doubt["code"])]]
    return ("%s. Rule finding: %s (%s) at step %s (%s). The rule-based check alone says %s: %s."
            % (kind, doubt["code"], doubt.get("severity"), _fmt(doubt.get("step")), facts,
               verdict.get("verdict"), verdict.get("reason")))


def build_prompt(run, verdict: dict, opts: dict, doubt: dict) -> str:
    """The seed workflow's question: run, step / total, last 10 losses, last 3 evals, the
    baseline when declared, and exactly what is unsure."""
    main = run.main_loss()
    total = _fmt(_n(run.planned_steps)) if run.planned_steps else "unknown"
    lines = ["TRAINING HEALTH CHECK - need your judgment on ambiguous metrics.", "",
             "Run: %s" % (opts.get("run_id") or run.source or "?"),
             "Current step: %s / %s total" % (_fmt(verdict.get("last_step")), total),
             "Training loss %s (last 10 logged points, step: value): %s"
             % (main.name if main is not None else "", _pairs(main, 10) if main is not None else "none")]
    evals = _evals(run)
    lines.append("Eval metrics (last 3 evals): %s" % ("; ".join(evals) if evals else "none logged"))
    base = _baseline(opts, verdict.get("last_step"))
    if base:
        lines.append("Baseline reference: %s" % base)
    if opts.get("primary"):
        lines.append("Primary metric: %s (%s is better)" % (opts["primary"][0],
                                                           "lower" if opts["primary"][1] == "min" else "higher"))
    lines += ["", "What I'm unsure about: %s" % _doubt_text(doubt, verdict), "",
              "Please respond with exactly one word:",
              "- STOP: clearly problematic, should kill training",
              "- CONTINUE: looks fine, check again next interval",
              "- WAIT: not enough data to judge, check again sooner"]
    return "\n".join(lines)


def review_payload(run, verdict: dict, opts: dict, doubt: dict) -> dict:
    """What the reviewer command reads on stdin (and the prompt the HTTP reviewer gets)."""
    main = run.main_loss()
    evals = {}
    for name in sorted(run.series):
        if name.startswith(("eval_", "val_")):
            s = run.series[name]
            evals[name] = [[_n(a), _j(b)] for a, b in zip(s.steps[-20:], s.values[-20:])]
    return {"verdict_so_far": verdict["verdict"], "finding": doubt, "findings": verdict["findings"],
            "recent_loss": [[_n(a), _j(b)] for a, b in zip(main.steps[-200:], main.values[-200:])] if main else [],
            "evals": evals, "baseline": opts.get("baseline"),
            "primary": list(opts["primary"]) if opts.get("primary") else None,
            "source": run.source, "last_step": _n(run.last_step), "prompt": build_prompt(run, verdict, opts, doubt)}


# --- the answer -----------------------------------------------------------------------------

def parse_answer(text: Optional[str]) -> Tuple[str, str]:
    """(answer, note): a reply that is just STOP / CONTINUE / WAIT (any case, surrounding
    punctuation, quotes, markdown or whitespace) is that word; anything else is WAIT."""
    word = re.sub(r"^[\s\W_]+|[\s\W_]+$", "", text or "").upper()
    if word in ANSWERS:
        return word, ""
    return "WAIT", "unusable reviewer answer: %r" % (text or "")[:200]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error: the Authorization header must not follow it to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102
        return None


def _scrub(text: str, key: Optional[str]) -> str:
    return text.replace(key, "***") if key else text


def ask_http(cfg: dict, prompt: str, key: Optional[str]) -> dict:
    """POST the prompt; {answer, note, status, reply, latency_s}. Never raises, never STOP on error."""
    url = cfg["base_url"].rstrip("/") + "/chat/completions"
    body = json.dumps({"model": cfg["model"], "temperature": 0, "max_tokens": MAX_TOKENS,
                       "messages": [{"role": "system", "content": "You review machine-learning training runs. "
                                     "Answer with exactly one word: STOP, CONTINUE or WAIT."},
                                    {"role": "user", "content": prompt}]}).encode()
    headers = {"Content-Type": "application/json", "Accept": "application/json", "User-Agent": "gpurun-reviewer"}
    if key:
        headers["Authorization"] = "Bearer " + key
    timeout = float(cfg.get("timeout_s") or DEFAULT_TIMEOUT_S)
    t0 = time.monotonic()
    res = {"answer": "WAIT", "note": "", "status": None, "reply": None, "answered": False}
    try:
        opener = urllib.request.build_opener(_NoRedirect)
        with opener.open(urllib.request.Request(url, data=body, headers=headers, method="POST"),
                         timeout=timeout) as resp:
            res["status"] = resp.status
            raw = resp.read(1 << 20)
        try:
            content = json.loads(raw.decode("utf-8"))["choices"][0]["message"]["content"]
            if not isinstance(content, str):
                raise TypeError("content is %s" % type(content).__name__)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            res["note"] = "malformed reviewer reply (%s): %r" % (type(exc).__name__, _scrub(raw[:120].decode(
                "utf-8", "replace"), key))
        else:
            res["reply"] = _scrub(content[:500], key)
            res["answer"], res["note"] = parse_answer(content)
            res["note"] = _scrub(res["note"], key)
            res["answered"] = not res["note"]
    except urllib.error.HTTPError as exc:
        res["status"] = exc.code
        why = {429: "rate limited", 401: "key refused", 403: "key refused"}.get(exc.code, "")
        if 300 <= exc.code < 400:
            why = "redirect refused"
        elif exc.code >= 500:
            why = "server error"
        res["note"] = "reviewer HTTP %d%s" % (exc.code, (" (%s)" % why) if why else "")
    except (socket.timeout, TimeoutError):
        res["note"] = "reviewer timed out after %gs" % timeout
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            res["note"] = "reviewer timed out after %gs" % timeout
        else:
            res["note"] = "reviewer unreachable: %s" % _scrub(str(reason), key)[:200]
    except (OSError, ValueError) as exc:  # reset mid-reply, bad URL, ...
        res["note"] = "reviewer request failed: %s" % _scrub(str(exc), key)[:200]
    res["latency_s"] = round(time.monotonic() - t0, 4)
    return res


def ask_command(cmd: str, payload: dict, timeout: float) -> dict:
    """Run the reviewer command with ``payload`` as JSON on stdin; its first word decides."""
    t0 = time.monotonic()
    res = {"answer": "WAIT", "note": "", "answered": False}
    try:
        p = subprocess.run(["/bin/sh", "-c", cmd], input=json.dumps(payload, default=str),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=timeout)
        words = (p.stdout or "").strip().split()
        word = words[0].strip(".:!,").upper() if words else ""
        if p.returncode == 0 and word in ANSWERS:
            res["answer"], res["note"], res["answered"] = word, " ".join(words[1:])[:200], True
        else:
            res["note"] = "unusable reviewer answer (exit %d): %r" % (p.returncode, (p.stdout or "")[:80])
        res["reply"] = (p.stdout or "")[:500]
    except subprocess.TimeoutExpired:
        res["note"] = "reviewer timed out after %gs" % timeout
    except OSError as exc:
        res["note"] = "reviewer could not run: %s" % exc
    res["latency_s"] = round(time.monotonic() - t0, 4)
    return res


def env_key(name: str) -> Optional[str]:
    import os
    return os.environ.get(name)


def review(out: dict, run, opts: dict, doubt: dict) -> None:
    """Ask the configured reviewer about ``doubt`` and make its answer ``out``'s verdict.

    Records ``out["reviewer"]`` = {kind, answer, note, in_doubt, question, reply, judge_verdict,
    judge_reason, answered, latency_s (+ model, base_url, key_env, status for HTTP; ``reused`` when
    ``opts["reviewer_memo"]``, the last answer, still ``standing`` at ``opts["now"]``: no request)}
    and an ``info`` finding ``reviewer``. ``opts["reviewer_key"]``: a callable NAME -> key
    (default: the environment); the key itself is never stored."""
    cfg = opts.get("reviewer")
    judge_verdict, judge_reason = out["verdict"], out["reason"]
    rec = {"in_doubt": doubt["code"], "judge_verdict": judge_verdict, "judge_reason": judge_reason}
    m = opts.get("reviewer_memo")
    until = standing(m, doubt, int(out.get("points") or 0), float(opts.get("now") or time.time()))
    if until is not None:  # the same doubt, little new data: the last answer stands, nothing is sent
        rec.update(kind="http" if cfg else "command", answer=m["answer"], answered=True, reused=True,
                   latency_s=0.0, question=None, note="%s (answered at %d loss points; asked again from %d)"
                   % (m["note"] or "the last answer stands", m["points"], until))
    elif cfg:
        question = build_prompt(run, out, opts, doubt)
        key = None
        if cfg.get("key_env"):
            lookup = opts.get("reviewer_key") or env_key
            key = lookup(cfg["key_env"])
        rec.update(kind="http", model=cfg["model"], base_url=cfg["base_url"], key_env=cfg.get("key_env"),
                   question=question)
        if cfg.get("key_env") and not key:
            rec.update(answer="WAIT", status=None, reply=None, latency_s=0.0, answered=False,
                       note="reviewer key %s is not set (on a host: gpurun secret set %s --host H)"
                       % (cfg["key_env"], cfg["key_env"]))
        else:
            rec.update(ask_http(cfg, question, key))
    else:
        payload = review_payload(run, out, opts, doubt)
        timeout = float(opts.get("reviewer_timeout_s") or DEFAULT_TIMEOUT_S)
        rec.update(kind="command", question=payload["prompt"])
        rec.update(ask_command(opts["reviewer_command"], payload, timeout))
    answer, note = rec["answer"], rec["note"]
    out["findings"].append({"code": "reviewer", "severity": "info", "step": doubt.get("step"), "series": "",
                            "evidence": {"answer": answer, "note": note, "in_doubt": doubt["code"]},
                            "hint": "verdict given by the reviewer (%s)" % (
                                "quality.reviewer: %s" % cfg["model"] if cfg else "quality.reviewer_command")})
    out["reviewer"] = rec
    out["verdict"] = answer
    if not rec["answered"]:
        out["reason"] = "reviewer gave no answer (%s); WAIT on %s" % (note, doubt["code"])
    else:
        out["reason"] = "reviewer answered %s on %s%s" % (answer, doubt["code"], (": " + note) if note else "")
