"""Figure for the built-in reviewer: what one ambiguous check adds when it asks the reviewer.

Three checks, interleaved round by round so drift hits them alike, each reading and judging a
400-point JSONL file with ``quality.reviewer`` configured (a loopback chat-completions server
that answers CONTINUE at once):

* ambiguous: a flat-from-start run (no_learning) -> one POST to the reviewer;
* ambiguous, no reviewer: the same run judged without a reviewer (the judge alone);
* clear: a healthy run of the same length -> no request.

The reviewer's added latency is "ambiguous" minus "ambiguous, no reviewer" (what the request,
the prompt and the answer cost); "clear" shows a healthy check pays nothing for having one.

Run: python bench/bench_reviewer.py [ROUNDS]
"""

from __future__ import annotations

import http.server
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time

from orchestrator.quality import reviewer as RV
from orchestrator.quality.judge import check


class Chat(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.hits += 1
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": "CONTINUE"}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def _write(path: str, fn) -> str:
    with open(path, "w") as f:
        for i in range(400):
            f.write(json.dumps({"step": (i + 1) * 10, "loss": fn(i)}) + "\n")
    return path


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    srv.hits = 0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    d = tempfile.mkdtemp(prefix="gpurun-bench-reviewer-")
    flat = _write(os.path.join(d, "flat.jsonl"), lambda i: 2.3 * (1 + 0.003 * math.sin(i * 1.7)))
    healthy = _write(os.path.join(d, "healthy.jsonl"),
                     lambda i: 4.0 * (10 * i + 60) ** -0.3 * (1 + 0.01 * math.sin(i)))
    rev = {"reviewer": RV.settings({"base_url": "http://127.0.0.1:%d/v1" % srv.server_address[1],
                                    "model": "bench", "key_env": "BENCH_KEY", "timeout_s": 10}),
           "reviewer_key": lambda name: "bench-key"}
    cases = {"ambiguous, asks the reviewer": (flat, rev, "CONTINUE"),
             "ambiguous, no reviewer configured": (flat, {}, "STOP"),
             "clear (healthy), reviewer configured": (healthy, rev, "CONTINUE")}
    times = {k: [] for k in cases}
    for name, (path, opts, want) in cases.items():  # warm-up and sanity
        assert check(path, dict(opts))["verdict"] == want, name
    srv.hits = 0
    for _ in range(rounds):
        for name, (path, opts, _) in cases.items():
            t = time.perf_counter()
            check(path, dict(opts))
            times[name].append(time.perf_counter() - t)
    assert srv.hits == rounds, srv.hits  # exactly one request per ambiguous check, none otherwise
    print("python %s, %d rounds interleaved, 400-point JSONL, loopback reviewer answering at once"
          % (sys.version.split()[0], rounds))
    med = {}
    for name, xs in times.items():
        xs.sort()
        med[name] = statistics.median(xs)
        print("  %-38s median %6.2f ms  p90 %6.2f ms" % (name, med[name] * 1e3, xs[int(0.9 * len(xs))] * 1e3))
    print("  requests sent: %d (one per ambiguous check)" % srv.hits)
    print("  added by the reviewer (median): %.2f ms" % ((med["ambiguous, asks the reviewer"]
                                                        - med["ambiguous, no reviewer configured"]) * 1e3))
    srv.shutdown()


if __name__ == "__main__":
    main()
