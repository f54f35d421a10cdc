"""Load test on loopback: concurrent heavy analyses while a client polls ``GET /``.

    python scripts/load_test.py [--requests 20] [--dim 1024] [--batch 32] [--repeat 100] [--json]

Starts the web app under waitress on 127.0.0.1 (a free port; the threads
``python -m mlexec.web`` gives it), fires ``--requests`` analyses at once (each
accepted by the compute budget), polls ``GET /`` every ``--poll`` seconds until
every analysis has answered, then stops the server. It reports ``GET /``
latency (p50, p99), how many analyses completed (200), were turned away (503)
or timed out (504), any other status, and the peak RSS of the server and of the
server with its analysis processes. Bounded: every request has a client
timeout and the whole run a deadline (``--deadline``). Exit status 1 if
anything answered 500 (or any status other than 200/503/504), or a poll failed.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0          # the process ended between listing and reading


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = open(f"/proc/{parent}/task/{task}/children").read().split()
            except OSError:
                continue
            found += map(int, children)
            todo += map(int, children)
    return found


def request(url: str, body: dict | None, timeout: float) -> tuple[int, float]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as err:
        err.read()
        status = err.code
    except OSError:
        status = -1       # no answer within the client timeout, or the connection failed
    return status, time.perf_counter() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_server(env: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-c",
           "import sys; from waitress import serve; from mlexec.web import app; c = app.config; "
           f"serve(app, host='127.0.0.1', port={port}, "
           "threads=c['ANALYSIS_WORKERS'] + c['ANALYSIS_QUEUE'] + 4)"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        if request(url + "/", None, 1)[0] == 200:
            return proc, url
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not answer GET / within 30 s")


def run(args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.timeout:
        env["MLEXEC_ANALYSIS_TIMEOUT"] = str(args.timeout)
    proc, url = start_server(env)
    body = {"values": "1, 0.5, -1", "model": args.model, "dim": args.dim, "batch": args.batch,
            "repeat": args.repeat, "engines": args.engines.split(",")}
    polls: list[tuple[int, float]] = []
    peak = {"server": rss_bytes(proc.pid), "server+analyses": rss_bytes(proc.pid)}
    done = threading.Event()

    def poll():
        while not done.is_set():
            polls.append(request(url + "/", None, args.deadline))
            server = rss_bytes(proc.pid)
            peak["server"] = max(peak["server"], server)
            peak["server+analyses"] = max(peak["server+analyses"],
                                          server + sum(rss_bytes(p) for p in descendants(proc.pid)))
            done.wait(args.poll)

    start = time.perf_counter()
    try:
        poller = threading.Thread(target=poll)
        poller.start()
        with ThreadPoolExecutor(max_workers=args.requests) as pool:
            answers = list(pool.map(lambda _: request(url + "/api/analyze", body, args.deadline),
                                    range(args.requests)))
        done.set()
        poller.join()
    finally:
        done.set()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    statuses = [s for s, _ in answers]
    latencies = [t for s, t in polls if s == 200]
    return {
        "cpu": next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                     if line.startswith("model name")), "?"),
        "cores": os.cpu_count(), "request": body, "requests": args.requests,
        "wall_s": time.perf_counter() - start,
        "completed": statuses.count(200), "busy_503": statuses.count(503), "timed_out_504": statuses.count(504),
        "other": sorted(s for s in statuses if s not in (200, 503, 504)),
        "analysis_s": {str(code): sorted(round(t, 1) for s, t in answers if s == code) for code in set(statuses)},
        "get_polls": len(polls), "get_failed": sum(1 for s, _ in polls if s != 200),
        "get_p50_ms": 1e3 * statistics.median(latencies) if latencies else None,
        "get_p99_ms": 1e3 * percentile(latencies, 0.99) if latencies else None,
        "get_max_ms": 1e3 * max(latencies) if latencies else None,
        "peak_rss_mib": {k: v / 2**20 for k, v in peak.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20, help="concurrent analyses (default %(default)r)")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--engines", default="naive,static,arena,fused")
    parser.add_argument("--timeout", type=float, default=None, help="the server's analysis timeout, s")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between GET / polls")
    parser.add_argument("--deadline", type=float, default=300.0, help="client timeout per request, s")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 200:
        parser.error("--requests must be in 1..200")
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['requests']} concurrent analyses of {result['request']} on {result['cpu']} "
              f"({result['cores']} cores), {result['wall_s']:.0f} s")
        print(f"  completed {result['completed']}, 503 {result['busy_503']}, 504 {result['timed_out_504']}, "
              f"other {result['other']}")
        print(f"  GET / while loaded: p50 {result['get_p50_ms']:.1f} ms, p99 {result['get_p99_ms']:.1f} ms, "
              f"max {result['get_max_ms']:.1f} ms over {result['get_polls']} polls ({result['get_failed']} failed)")
        print("  peak RSS: " + ", ".join(f"{k} {v:.0f} MiB" for k, v in result["peak_rss_mib"].items()))
    return 1 if result["other"] or result["get_failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
