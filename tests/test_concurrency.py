"""50 concurrent requests against the app under waitress, in its own process; RSS stays bounded."""
import json
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT, subprocess_env

RSS_BOUND_MIB = 200   # whole server process (measured ~50 MiB): one analysis at a time, dim=64 models


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "waitress", "--host=127.0.0.1", f"--port={port}",
                             "--threads=8", "mlexec.web:app"], cwd=ROOT, env=subprocess_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None:
                raise AssertionError(proc.stderr.read().decode())
            time.sleep(0.1)
    yield url, proc
    proc.terminate()
    proc.wait(timeout=10)


def post(url: str, body: dict):
    req = urllib.request.Request(url + "/api/analyze", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_fifty_concurrent_requests(server):
    url, proc = server
    bodies = [{"values": [i, 0.5, -1], "dim": 64, "batch": 1 + i % 4, "repeat": 3} for i in range(45)]
    bodies += [{"values": "1,,2"} for _ in range(5)]    # bad input mixed in: 400, not a failure
    peak = rss_mib(proc.pid)
    with ThreadPoolExecutor(max_workers=50) as pool:
        futures = [pool.submit(post, url, b) for b in bodies]
        while not all(f.done() for f in futures):
            peak = max(peak, rss_mib(proc.pid))
            time.sleep(0.02)
    results = [f.result() for f in futures]
    peak = max(peak, rss_mib(proc.pid))
    ok = [body for status, body in results[:45] if status == 200]
    assert len(ok) == 45
    assert [b["input"]["first_values"][0] for b in ok] == list(range(45))   # each answer is its own request's
    assert all(status == 400 and "empty value" in body["error"] for status, body in results[45:])
    print(f"server peak RSS under 50 concurrent requests: {peak:.0f} MiB")
    assert peak < RSS_BOUND_MIB
