"""Analyses for the web app: at most ``workers`` at once, a bounded queue, a hard timeout.

Each analysis runs in its own process (forked from a ``forkserver`` that has
``mlexec.analysis`` imported, so a start costs milliseconds), because only a
process can be stopped: an analysis past ``timeout`` seconds is killed, its
memory and cores freed at once, and the request answers ``TimedOut``. A thread
could only be abandoned, still computing. Processes also let ``workers``
analyses measure at once (tracemalloc and the heap pinning are per process); each
gets ``cores // workers`` BLAS threads so that they do not oversubscribe the cores.

Admission: ``workers`` run, ``queue`` more wait (each up to ``timeout``), and
any request beyond those gets ``Busy`` at once (the app's 503 with Retry-After).
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time

from ..analysis import AnalysisError, prepare_analysis


class Busy(Exception):
    """Every worker is busy and the queue is full."""


class TimedOut(Exception):
    """The analysis (or its wait in the queue) took longer than the timeout; it was stopped."""


def _child(conn, job: dict, blas_threads: int) -> None:
    from threadpoolctl import threadpool_limits

    from ..analysis import measure_analysis

    try:
        with threadpool_limits(blas_threads):
            conn.send(("ok", measure_analysis(job)))
    except AnalysisError as exc:
        conn.send(("error", str(exc)))
    except Exception as exc:          # handed to the app, which logs it and answers 500
        conn.send(("crash", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


class AnalysisRunner:
    def __init__(self, workers: int, queue: int, timeout: float):
        self.workers, self.queue, self.timeout = workers, queue, timeout
        self._admitted = threading.BoundedSemaphore(workers + queue)
        self._running = threading.BoundedSemaphore(workers)
        self._blas_threads = max(1, (os.cpu_count() or 1) // workers)
        self._ctx = multiprocessing.get_context("forkserver")
        self._ctx.set_forkserver_preload(["mlexec.analysis"])
        self._count_lock = threading.Lock()
        self.admitted = 0                      # running + waiting, for status and tests

    def _count(self, delta: int) -> None:
        with self._count_lock:
            self.admitted += delta

    def run(self, values, **options) -> dict:
        """run_analysis(values, **options), checked here and measured in a worker process;
        raises AnalysisError (bad input, over a budget: before any queueing), Busy or TimedOut."""
        job = prepare_analysis(values, **options)
        if not self._admitted.acquire(blocking=False):
            raise Busy(f"{self.workers} analyses are running and {self.queue} are waiting")
        self._count(1)
        try:
            if not self._running.acquire(timeout=self.timeout):
                raise TimedOut(f"waited {self.timeout:g} s in the queue for a free worker")
            try:
                return self._in_process(job)
            finally:
                self._running.release()
        finally:
            self._count(-1)
            self._admitted.release()

    def _in_process(self, job: dict) -> dict:
        receive, send = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(target=_child, args=(send, job, self._blas_threads), daemon=True)
        start = time.monotonic()
        proc.start()
        send.close()
        try:
            if not receive.poll(self.timeout):
                raise TimedOut(f"the analysis ran {time.monotonic() - start:.0f} s, past the "
                               f"{self.timeout:g} s limit, and was stopped")
            try:
                kind, payload = receive.recv()
            except EOFError:
                raise RuntimeError(f"the analysis process ended without a result (exit code {proc.exitcode})") \
                    from None
        finally:
            receive.close()
            if proc.is_alive():
                proc.kill()
            proc.join()
        if kind == "error":
            raise AnalysisError(payload)
        if kind == "crash":
            raise RuntimeError(payload)
        return payload
