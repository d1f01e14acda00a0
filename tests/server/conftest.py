"""Fixtures for the `dsv4 serve` tests: a (synthetic) model, and servers on free loopback ports.

Environment:
  DSV4_BIN           the dsv4 binary (default: build/dsv4 in the repository)
  DSV4_TEST_MODEL    a model directory to reuse (default: `dsv4 synth` into a temporary directory)
  DSV4_SERVER_CONC   concurrent streaming clients in the batching test (default 16)
  DSV4_SERVER_TOKENS max_tokens per client in that test (default 24)
  DSV4_SERVER_THREADS CPU threads for the server (default 2)
"""
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
API_KEY = "test-key-123"


def dsv4_bin():
    b = os.environ.get("DSV4_BIN", os.path.join(REPO, "build", "dsv4"))
    if not os.path.isabs(b):
        b = os.path.join(REPO, b)
    return b


@pytest.fixture(scope="session")
def model_dir():
    m = os.environ.get("DSV4_TEST_MODEL")
    if m:
        yield m
        return
    with tempfile.TemporaryDirectory(prefix="dsv4-srv-model-") as d:
        out = os.path.join(d, "tiny")
        subprocess.run([dsv4_bin(), "synth", "-o", out], cwd=REPO, check=True, capture_output=True)
        yield out


class Server:
    def __init__(self, model, *args, env=None):
        cmd = [dsv4_bin(), "serve", "-m", model, "--port", "0", "--threads",
               os.environ.get("DSV4_SERVER_THREADS", "2"), *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env={**os.environ, **(env or {})}, text=True)
        self.log = []
        self.port = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if "listening on http://" in line:
                self.port = int(line.rsplit(":", 1)[1])
                break
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("dsv4 serve did not start:\n" + "".join(self.log))
        # keep draining stderr so the server never blocks on a full pipe
        self._t = threading.Thread(target=self._drain, daemon=True)
        self._t.start()
        self.base = f"http://127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._t.join(timeout=5)
        return rc


@pytest.fixture(scope="session")
def server(model_dir):
    s = Server(model_dir, "--api-key", API_KEY, "--max-seqs", "16", "--max-context", "1024",
               "--max-body", "65536", "--served-model-name", "dsv4-test")
    yield s
    rc = s.stop()
    assert rc == 0, "".join(s.log)
