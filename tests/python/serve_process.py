"""`nopad serve` as a process on loopback, for every serve test (no openai import, so a test that
speaks plain HTTP runs without the client installed)."""
import http.client
import json
import os
import re
import subprocess
import threading
import time

import pytest

from conftest import REPO

CLI = os.environ.get("NOPAD_CLI", str(REPO / "build" / "nopad"))
KEY = "sk-nopad-test"


class Server:
    """`nopad serve --port 0 ARGS` on loopback; its port read from its first line."""

    def __init__(self, *args):
        self.proc = subprocess.Popen([CLI, "serve", "--port", "0", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        deadline = time.time() + 120
        self.port = None
        while self.port is None:
            line = self.proc.stderr.readline()
            if not line:
                if "without libmicrohttpd" in "".join(self.log):
                    pytest.skip("nopad was built without libmicrohttpd")
                raise RuntimeError("nopad serve did not start: %s" % "".join(self.log))
            self.log.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
            assert time.time() < deadline
        self._drain = threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True)
        self._drain.start()

    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers, raw body); the test key as the bearer token (ignored by a server
        started without --api-key)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Authorization": "Bearer " + KEY}
        h.update(headers or {})
        data = json.dumps(body) if isinstance(body, (dict, list)) else body
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        out = r.status, dict(r.getheaders()), r.read()
        conn.close()
        return out

    def metrics(self):
        status, _, body = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def stop(self):
        self.proc.terminate()
        rc = self.proc.wait(timeout=60)
        assert rc == 0, "nopad serve exited %d: %s" % (rc, "".join(self.log))
