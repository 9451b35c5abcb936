"""A loopback HTTP server that tools call and hooks deliver to: it counts every
request, keeps what it was sent, and can hold a request open until the test
releases it. As a hook receiver it checks each delivery as a real one must, with
`signoff.hooks.verify` (the hook secret the tests configure, HOOK_SECRET), and
refuses one that does not verify (401)."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from signoff.hooks import SIGNATURE_HEADER, InvalidSignature, verify

# The tests' hook secret: 32 bytes or more, as the publisher requires.
HOOK_SECRET = "tests-hook-secret-0123456789abcdef"


class Sink:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        self.counts: Counter[str] = Counter()
        self.hold = threading.Event()
        self.hold.set()  # set = not holding
        self.held = threading.Event()
        self.status = 200
        # None: answer with the request's count; else the body it makes of the request
        # (e.g. an error that repeats what it was sent).
        self.answer_with: Callable[[dict], bytes] | None = None
        self.hook_secret = HOOK_SECRET
        self.hold_path: str | None = None
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                verified = None
                if self.headers.get(SIGNATURE_HEADER) is not None:
                    try:
                        verify(sink.hook_secret, body, dict(self.headers))
                        verified = True
                    except InvalidSignature:
                        verified = False
                record = {"method": self.command, "path": self.path, "headers": dict(self.headers),
                          "body": body.decode(errors="replace"), "verified": verified}
                sink.requests.append(record)
                sink.counts[self.path] += 1
                if not sink.hold.is_set() and not sink.held.is_set() and (
                        sink.hold_path is None or self.path.startswith(sink.hold_path)):
                    sink.held.set()
                    sink.hold.wait(60)
                answer_with = sink.answer_with
                payload = answer_with(record) if answer_with else json.dumps(
                    {"ok": True, "n": sink.counts[self.path]}).encode()
                try:
                    self.send_response(401 if verified is False else sink.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass

            do_POST = do_PUT = do_GET = do_DELETE = _handle

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.hold.set()
        self.server.shutdown()
        self.server.server_close()

    def hold_next(self, path: str | None = None) -> None:
        """Hold the next request (to this path), after it is counted, until release()."""
        self.hold_path = path
        self.held.clear()
        self.hold.clear()

    def wait_held(self, timeout: float = 20.0) -> None:
        if not self.held.wait(timeout):
            raise AssertionError(f"no request to {self.hold_path or 'the sink'} within {timeout}s")

    def headers_of(self, path: str, header: str) -> list[str]:
        return [r["headers"].get(header) for r in self.requests if r["path"].startswith(path)]

    def release(self) -> None:
        self.hold.set()
