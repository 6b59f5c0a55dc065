"""A real HTTP server on 127.0.0.1 for the artefact download tests."""

from __future__ import annotations

import http.server
import threading

import pytest


class _Files(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """A real HTTP server on 127.0.0.1 serving tmp_path/www; yields (base URL, root, request log)."""
    root = tmp_path / "www"
    root.mkdir()
    requests: list[str] = []

    class Handler(_Files):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            requests.append(self.path)
            super().do_GET()

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", root, requests
    httpd.shutdown()
    httpd.server_close()
