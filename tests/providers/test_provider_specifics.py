"""Provider quirks: Lambda's hanging terminate, RunPod's premature delete ack, AutoDL's
power-off-before-release and 200-with-error envelope, and the HTTP client's edges."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from orchestrator.errors import ProfileError, ProviderError
from orchestrator.providers import CreateSpec, make_provider
from orchestrator.providers.http import MAX_RETRY_AFTER_S, retry_after_seconds
from rigs.fake_providers import KEY
from test_provider_contract import rent

from providers.conftest import fake_for


@pytest.mark.parametrize("effect", [True, False])
def test_lambda_hanging_terminate_requeries_then_retries(monkeypatch, effect):
    fake = fake_for("lambda", monkeypatch, ssh=("127.0.0.1", 22))
    try:
        prov = make_provider("lambda", sleep=lambda s: None)
        inst = rent(prov)
        fake.hang_terminate_s, fake.hang_effect = 1.0, effect
        prov.terminate_timeout_s = 0.2
        t0 = time.monotonic()
        prov.terminate(inst.id)
        assert time.monotonic() - t0 < 0.9          # bounded by the client-side timeout
        calls = fake.routes[("POST", "/instance-operations/terminate")]
        # took effect despite the hang: re-query shows it, no second terminate is fired
        assert calls == (1 if effect else 2)
        assert fake.state_of(inst.id) == "terminating"
        prov.wait_gone(inst.id, timeout=5, interval=0)
    finally:
        fake.close()


def test_runpod_delete_ack_is_not_proof(monkeypatch):
    fake = fake_for("runpod", monkeypatch, gone_polls=3)
    try:
        prov = make_provider("runpod", sleep=lambda s: None)
        inst = rent(prov)
        prov.terminate(inst.id)
        assert prov.refresh(inst.id).state != "terminated"   # 200 after the 204
        assert prov.wait_gone(inst.id, timeout=5, interval=0) >= 3
    finally:
        fake.close()


def test_autodl_release_powers_off_first_and_reads_200_errors(monkeypatch):
    fake = fake_for("autodl", monkeypatch)
    try:
        prov = make_provider("autodl", sleep=lambda s: None)
        inst = rent(prov)
        prov.wait_state(inst.id, lambda i: i.ssh_reachable, timeout=5, interval=0)
        prov.terminate(inst.id)
        assert fake.routes[("POST", "/api/v1/dev/instance/pro/power_off")] == 1
        assert fake.routes[("POST", "/api/v1/dev/instance/pro/release")] == 1
        prov.wait_gone(inst.id, timeout=5, interval=0)
        with pytest.raises(ProviderError) as err:
            prov.create(CreateSpec(gpu="nope", offer_id="Nope GPU@westDC2", name="x"))
        assert "InvalidGpuSpec" in str(err.value) and err.value.status == 200
    finally:
        fake.close()


def test_retry_after_parsing():
    assert retry_after_seconds("7") == 7.0
    assert retry_after_seconds(None, default=2.0) == 2.0
    assert retry_after_seconds("garbage", default=1.5) == 1.5
    assert retry_after_seconds("99999") == MAX_RETRY_AFTER_S
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(1_000_010))
    assert retry_after_seconds(date, now=1_000_000) == pytest.approx(10.0)


def test_unreachable_api_is_retryable_and_keyless(monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", KEY)
    monkeypatch.setenv("GPURUN_RUNPOD_API_URL", "http://127.0.0.1:9/v1")   # discard port: refused
    prov = make_provider("runpod", sleep=lambda s: None)
    with pytest.raises(ProviderError) as err:
        prov.check_credentials()
    assert err.value.retryable and "no answer" in str(err.value) and KEY not in str(err.value)


def test_non_json_answer_is_a_provider_error(monkeypatch):
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>maintenance</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        monkeypatch.setenv("VAST_API_KEY", KEY)
        monkeypatch.setenv("GPURUN_VAST_API_URL", f"http://127.0.0.1:{srv.server_address[1]}/api/v0")
        with pytest.raises(ProviderError) as err:
            make_provider("vastai").check_credentials()
        assert "not JSON" in str(err.value)
    finally:
        srv.shutdown()
        srv.server_close()


def test_make_provider_config(monkeypatch):
    with pytest.raises(ProfileError):
        make_provider("paperspace-ish")
    monkeypatch.delenv("GPURUN_LAMBDA_API_URL", raising=False)
    p = make_provider("lambdalabs", {"base_url": "https://example.org/api/v1", "credential_env": "MY_LAMBDA"})
    assert (p.name, p.config.base_url, p.config.credential_env) == ("lambda", "https://example.org/api/v1",
                                                                   "MY_LAMBDA")
    monkeypatch.setenv("GPURUN_LAMBDA_API_URL", "http://127.0.0.1:1/api/v1")
    assert make_provider("lambda", {"base_url": "https://example.org"}).config.base_url.startswith("http://127")
