"""Engines under threads (ownership, EnginePool), and 50 concurrent requests against the app under waitress."""
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import ROOT, make_engine, subprocess_env
from engines import ENGINES, MODELS, EngineBusy, EnginePool

PLANNED = sorted(name for name, cls in ENGINES.items() if cls.returns_view)


def in_thread(fn):
    """fn() in another thread: its result, or the exception it raised."""
    box = []
    thread = threading.Thread(target=lambda: box.append(_call(fn)))
    thread.start()
    thread.join()
    return box[0]


def _call(fn):
    try:
        return fn()
    except Exception as exc:      # handed back to the test's thread
        return exc


@pytest.mark.parametrize("name", PLANNED)
def test_second_thread_is_refused_until_release(name):
    model = MODELS["mlp"](dim=32)
    engine = make_engine(name, model, 4)
    x = model.random_input(2, 0)
    y = engine.forward(x)
    expected = model.reference(x)
    refused = in_thread(lambda: engine.forward(model.random_input(2, 1)))
    assert isinstance(refused, EngineBusy) and "EnginePool" in str(refused) and "release()" in str(refused)
    np.testing.assert_allclose(y, expected, atol=engine.abs_tol)        # the owner's view untouched
    assert isinstance(in_thread(engine.release), EngineBusy)      # only the owner gives it up
    engine.release()
    x2 = model.random_input(3, 2)
    np.testing.assert_allclose(in_thread(lambda: np.array(engine.forward(x2))), model.reference(x2), atol=engine.abs_tol)
    assert isinstance(_call(lambda: engine.forward(x)), EngineBusy)   # now the other thread's


@pytest.mark.parametrize("name", PLANNED)
def test_one_engine_shared_by_two_threads_is_never_silently_wrong(name):
    """The failure first seen: two threads, one engine, outputs copied at once. Every call
    either returns the right answer or raises EngineBusy."""
    model = MODELS["mlp"](dim=64)
    engine = make_engine(name, model, 8)
    inputs = [model.random_input(8, seed) for seed in range(4)]
    expected = [model.reference(x) for x in inputs]

    def calls(offset):
        right = busy = wrong = 0
        for i in range(300):
            k = (i + offset) % len(inputs)
            try:
                y = np.array(engine.forward(inputs[k]))
            except EngineBusy:
                busy += 1
                continue
            if np.max(np.abs(y - expected[k])) < engine.abs_tol:
                right += 1
            else:
                wrong += 1
        return right, busy, wrong

    # Two distinct threads (an executor may run both tasks on one idle worker), started together.
    results = [None, None]
    start = threading.Barrier(2)

    def run(offset):
        start.wait()
        results[offset] = calls(offset)
    threads = [threading.Thread(target=run, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wrong for *_, wrong in results) == 0
    assert sorted(right for right, *_ in results) == [0, 300]     # the owner's all right, the other refused


@pytest.mark.parametrize("name", PLANNED)
def test_worker_shares_weights_not_buffers(name):
    """A worker allocates its activation memory only: the prepared weights are shared."""
    import tracemalloc

    model = MODELS["mlp"](dim=256)
    engine = make_engine(name, model, 2)
    tracemalloc.start()
    try:
        worker = engine.worker()
        allocated = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert engine.activation_bytes <= allocated < engine.activation_bytes + 64 * 1024 < engine.weight_bytes
    x = model.random_input(2, 0)
    a, b = engine.forward(x), worker.forward(x)
    assert not np.shares_memory(a, b)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", PLANNED + ["naive", "onnxruntime", "torch"])
def test_pool_from_threads_every_output_checked(name):
    """4 threads x 60 calls on a pool of 2: every result against the float64 reference."""
    model = MODELS["mlp"](dim=64)
    make_engine(name, model, 8)                                      # skips when unavailable
    pool = EnginePool(name, model, max_batch=8, size=2)
    rng = np.random.default_rng(0)
    inputs = [model.random_input(int(rng.integers(1, 9)), rng) for _ in range(240)]
    expected = [model.reference(x) for x in inputs]

    def work(indices):
        errors = []
        for i in indices:
            out = np.empty(model.output_shape(inputs[i].shape[0]), np.float32)
            y = pool.run(inputs[i], out=out) if i % 2 else pool.run(inputs[i])
            errors.append(float(np.max(np.abs(y - expected[i]))))
        return errors

    with ThreadPoolExecutor(max_workers=4) as threads:
        errors = [e for chunk in threads.map(work, [range(k, 240, 4) for k in range(4)]) for e in chunk]
    assert len(errors) == 240 and max(errors) < ENGINES[name].abs_tol


@pytest.mark.parametrize("name", PLANNED)
def test_view_stays_valid_inside_the_block_while_others_run(name):
    """The view one thread holds inside ``pool.engine()`` is not touched by other threads' forwards
    on the pool's other engines; it is read-only."""
    model = MODELS["mlp"](dim=64)
    make_engine(name, model, 4)
    pool = EnginePool(name, model, max_batch=4, size=3)
    x = model.random_input(4, 0)
    expected = model.reference(x)
    stop = threading.Event()

    def churn(seed):
        while not stop.is_set():
            pool.run(model.random_input(4, seed))

    with pool.engine() as engine:
        view = engine.forward(x)
        with pytest.raises(ValueError):
            view[0, 0] = 1.0
        with ThreadPoolExecutor(max_workers=2) as threads:
            futures = [threads.submit(churn, s) for s in (1, 2)]
            for _ in range(200):
                assert np.max(np.abs(view - expected)) < engine.abs_tol
            stop.set()
            [f.result() for f in futures]

RSS_BOUND_MIB = 200   # the server process (measured ~50 MiB); analyses run in their own processes


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
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)


def test_fifty_concurrent_requests(server):
    """Every answer is its own request's 200, a 400 for bad input (checked before queueing),
    or a 503 with Retry-After once the workers and the queue are full; never a 500."""
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
    ok = [(i, body) for i, (status, body, _) in enumerate(results[:45]) if status == 200]
    busy = [headers for status, _, headers in results[:45] if status == 503]
    assert len(ok) + len(busy) == 45 and ok
    assert all(body["input"]["first_values"][0] == i for i, body in ok)   # each answer is its own request's
    assert all(h.get("Retry-After") for h in busy)
    assert all(status == 400 and "empty value" in body["error"] for status, body, _ in results[45:])
    print(f"server peak RSS under 50 concurrent requests: {peak:.0f} MiB; {len(ok)} ran, {len(busy)} got 503")
    assert peak < RSS_BOUND_MIB


@pytest.mark.load
def test_load_script_small_run():
    """scripts/load_test.py end to end, small: 8 analyses at once on a server with 1 worker and a
    queue of 2 and a short timeout; every answer is 200, 503 or 504, GET / kept answering."""
    proc = subprocess.run([sys.executable, "scripts/load_test.py", "--requests", "8", "--dim", "64",
                           "--batch", "4", "--repeat", "3", "--engines", "naive,static", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(subprocess_env(), MLEXEC_ANALYSIS_WORKERS="1", MLEXEC_ANALYSIS_QUEUE="2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["other"] == [] and result["get_failed"] == 0 and result["get_polls"] > 0
    assert result["completed"] >= 1 and result["busy_503"] >= 8 - 3     # 1 running + 2 queued admitted
    assert result["completed"] + result["busy_503"] + result["timed_out_504"] == 8
