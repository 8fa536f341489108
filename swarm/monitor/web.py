"""`MonitorServer`: the monitor as a small read-only web page (`page.html`) and its data (`/snapshot.json`).

It answers GET for those two paths only, with no query handling, and serves nothing the run does not already
publish. It binds loopback unless told otherwise: exposing it is the operator's choice (`--http-host`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from swarm.monitor.snapshot import json_ready

logger = logging.getLogger(__name__)


def page() -> bytes:
    """The monitor page, shipped with the package."""
    return resources.files("swarm.monitor").joinpath("page.html").read_bytes()


class MonitorServer:
    """Serve `snapshot()` as JSON and the page that draws it, from a background thread until `stop`.

    :param port: 0 picks a free port (see `port` after construction)
    """

    def __init__(self, snapshot: Callable[[], dict[str, Any]], *, host: str = "127.0.0.1", port: int = 0) -> None:
        html = page()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path in ("/", "/index.html"):
                    self._send(200, "text/html; charset=utf-8", html)
                elif path == "/snapshot.json":
                    try:
                        body = json.dumps(json_ready(snapshot()), allow_nan=False, default=str).encode()
                    except Exception as e:  # a view that cannot be read now; the page says so and polls again
                        logger.warning("snapshot failed: %s", e)
                        self._send(503, "text/plain; charset=utf-8", f"snapshot failed: {e}".encode())
                        return
                    self._send(200, "application/json", body)
                else:
                    self._send(404, "text/plain; charset=utf-8", b"not found")

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                logger.debug("http: " + format, *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="monitor-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    def start(self) -> MonitorServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
