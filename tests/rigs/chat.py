"""A real HTTP server on loopback speaking the OpenAI chat-completions shape, for the reviewer.

``script`` is a list of ``(status, content, delay_s, raw_body)`` answered in order; once it is
empty every request gets ``answer``. ``received`` keeps each request's path, JSON body and headers.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from contextlib import contextmanager
from typing import Iterator


class Chat(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        srv = self.server
        srv.received.append({"path": self.path, "body": json.loads(body), "headers": dict(self.headers)})
        status, content, delay, raw = srv.script.pop(0) if srv.script else (200, srv.answer, 0, None)
        if delay:
            time.sleep(delay)
        reply = raw if raw is not None else json.dumps(
            {"id": "x", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "finish_reason": "stop",
                          "message": {"role": "assistant", "content": content}}]}).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        except OSError:  # the client gave up (timeout test)
            pass

    def log_message(self, *a: object) -> None:
        pass


@contextmanager
def chat_server(answer: str = "CONTINUE") -> Iterator[http.server.ThreadingHTTPServer]:
    """The server, with ``url`` (its base URL, ``.../v1``), ``received``, ``script`` and ``answer``."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    srv.daemon_threads = True
    srv.received, srv.script, srv.answer = [], [], answer  # type: ignore[attr-defined]
    srv.url = "http://127.0.0.1:%d/v1" % srv.server_address[1]  # type: ignore[attr-defined]
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
