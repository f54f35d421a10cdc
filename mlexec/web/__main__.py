"""``python -m mlexec.web``: serve the app with waitress on 0.0.0.0:$PORT (default 8000), debug off.

waitress gets enough threads for every admitted analysis (running and queued) plus four
for pages, so that a full queue never keeps ``GET /`` waiting.
"""
import os

from waitress import serve

from . import app

if __name__ == "__main__":     # not when a worker process imports the main module
    serve(app, host="0.0.0.0", port=int(os.environ.get("PORT", "8000")),
          threads=app.config["ANALYSIS_WORKERS"] + app.config["ANALYSIS_QUEUE"] + 4)
