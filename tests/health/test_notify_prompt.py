"""A failed job and a finished queue reach the webhook within seconds, from the real agent,
even though the watchdog ticks only once a minute."""

from __future__ import annotations

import json
import time


from rigs.agents import gpurun



def test_job_failure_is_notified_within_seconds(home, tmp_path, webhook, monkeypatch):
    monkeypatch.setenv("HOOK_URL", webhook.url)
    prof = home / ".config/gpurun/profiles"
    prof.mkdir(parents=True)
    (prof / "local.yaml").write_text("notify:\n  - {kind: generic, url_env: HOOK_URL, min_severity: warn}\n")
    q = tmp_path / "q.txt"
    q.write_text("[name=ok] true\n[name=broken] exit 3\n")
    t0 = time.time()
    assert gpurun("queue", "submit", str(q), "--wait").returncode == 1
    deadline = time.time() + 20
    kinds = []
    while time.time() < deadline:
        kinds = [r["body"]["kind"] for r in webhook.received]
        if "failed" in kinds and "queue_done" in kinds:
            break
        time.sleep(0.2)
    assert "failed" in kinds and "queue_done" in kinds, webhook.received
    assert time.time() - t0 < 20
    failed = [r["body"] for r in webhook.received if r["body"]["kind"] == "failed"][0]
    assert "broken" in failed["message"] and "HOOK_URL" not in json.dumps(failed)
