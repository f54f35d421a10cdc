"""``python -m mlexec.web``: serve the app with waitress on 0.0.0.0:$PORT (default 8000), debug off.

Prints the address it serves and one access-log line per request on stderr: client, method,
path, status and the time the app took. waitress gets enough threads for every admitted analysis
(running and queued) plus four for pages, so that a full queue never keeps ``GET /`` waiting.
"""
import logging
import os
import time

from waitress import serve

from . import app

log = logging.getLogger("mlexec.web.access")


def access_log(wsgi_app):
    """Wrap a WSGI app so that every request is logged once, after the app has answered."""
    def logged(environ, start_response):
        status = ["-"]

        def start(line, headers, exc_info=None):
            status[0] = line.split(" ", 1)[0]
            return start_response(line, headers, exc_info)

        began = time.perf_counter()
        try:
            return wsgi_app(environ, start)
        finally:
            query = environ.get("QUERY_STRING")
            path = environ.get("PATH_INFO", "") + ("?" + query if query else "")
            log.info('%s "%s %s" %s %.1f ms', environ.get("REMOTE_ADDR", "-"), environ.get("REQUEST_METHOD"),
                     path, status[0], (time.perf_counter() - began) * 1e3)
    return logged


if __name__ == "__main__":     # not when a worker process imports the main module
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    port = int(os.environ.get("PORT", "8000"))
    log.info("open http://127.0.0.1:%d/ in a browser (Ctrl-C stops)", port)
    serve(access_log(app), host="0.0.0.0", port=port,
          threads=app.config["ANALYSIS_WORKERS"] + app.config["ANALYSIS_QUEUE"] + 4)
