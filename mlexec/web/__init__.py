"""The analyzer's web face: a form, a results page with charts, a history page, a JSON API.

``create_app()`` builds the Flask app; ``app`` is the module-level instance
for ``waitress-serve --host 0.0.0.0 --port $PORT mlexec.web:app``. Every
analysis goes through ``mlexec.analysis`` (checked by ``prepare_analysis``, run by the runner); bad input is a 400
(the form page again, with the user's values and the error, or
``{"error": ...}`` from the API), never a 500. A request over its size limit
gets the same 400-style message naming the limit, instead of a bare 413.

Uploads (``UploadRequest``): every file part of a form is written to a temporary file on disk
as the body is parsed, and a model file reaches the importer as that file's path; the files are
deleted when the request ends. Only ``POST /analyze`` may carry a model file of up to
``MAX_MODEL_BYTES``; every other body and every form field is held to ``TEXT_REQUEST_BYTES``.

Load (``runner``): an analysis over the compute budget is a 400 before it runs;
at most ``ANALYSIS_WORKERS`` run at once, each in its own process, and
``ANALYSIS_QUEUE`` more wait; beyond those a 503 with ``Retry-After``; one
past ``ANALYSIS_TIMEOUT`` seconds is killed and answers 504. Every response
carries ``SECURITY_HEADERS`` (docs/reliability.md).
"""
from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

from flask import (
    Flask,
    Request,
    current_app,
    jsonify,
    render_template,
    request,
    url_for,
)
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge
from werkzeug.utils import secure_filename

from engines import ENGINES, MODELS

from ..analysis import LIMITS, AnalysisError, load_model_file
from ..defaults import ANALYZER_ENGINES
from ..units import fmt_bytes, fmt_time
from .runner import AnalysisRunner, Busy, TimedOut

# An uploaded ONNX model (stated on the form): one file, no external data, at most the
# MAX_MODEL_BYTES setting and this many graph nodes, checked before any engine is built.
MODEL_LIMITS = {"max_nodes": 2000}
# The default MAX_MODEL_BYTES. An analysis holds (3 + engines) copies of the weights within
# LIMITS["max_estimated_bytes"] (512 MiB): a larger file could not run even one engine
# (docs/analyzer.md, "Model files").
MODEL_FILE_BYTES = LIMITS["max_estimated_bytes"] // 4
# Every body but a model file, and every form field: the input text (percent-encoded in a
# urlencoded form: at most three bytes per byte) plus the other fields.
TEXT_REQUEST_BYTES = 3 * LIMITS["max_input_bytes"] + 64 * 1024

DEFAULTS = {"input": "1.0, 0.5", "model": "mlp", "dim": "1024", "batch": "1", "repeat": "20",
            "seed": "0", "engines": list(ANALYZER_ENGINES)}
API_KEYS = {"values", "model", "dim", "batch", "engines", "repeat", "seed"}

log = logging.getLogger("mlexec.web")

CORES = os.cpu_count() or 1
# Each can be set in the environment as MLEXEC_<NAME> (e.g. MLEXEC_ANALYSIS_TIMEOUT=60).
LOAD_DEFAULTS = {
    "ANALYSIS_WORKERS": CORES,            # analyses at once: one per core
    "ANALYSIS_QUEUE": 2 * CORES,          # waiting behind them; serve with threads > workers + queue
    "ANALYSIS_TIMEOUT": 2 * LIMITS["max_estimated_seconds"],   # seconds; room for a loaded machine
    "RETRY_AFTER": 10,                    # seconds, in a 503's Retry-After
    "MAX_MODEL_BYTES": MODEL_FILE_BYTES,  # an uploaded ONNX file
    "UPLOAD_FOLDER": tempfile.gettempdir(),   # where uploads are spooled while their request lasts
}


def _load_settings() -> dict:
    settings = {}
    for key, default in LOAD_DEFAULTS.items():
        text = os.environ.get(f"MLEXEC_{key}")
        try:
            settings[key] = default if text is None else type(default)(text)
        except ValueError:
            raise SystemExit(f"MLEXEC_{key} must be a number like {default!r}, got {text!r}") from None
    return settings

# Scripts only from the app's own static files (the history page's filter), never inline.
# Styles: the app's stylesheet, and inline ones: the page's <style> block, the charts' bar widths
# (style="width:..%") and matplotlib's SVG (style attributes) are inline, so style-src needs
# 'unsafe-inline'; nothing else loads.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


class UploadRequest(Request):
    """Flask's request, with each uploaded file part written to a named temporary file in the
    app's ``UPLOAD_FOLDER`` as the body is parsed (werkzeug writes it in 64 KiB chunks), so that
    a model file reaches the importer as a path and is never held in memory whole (werkzeug's
    own spooling keeps small files in memory and large ones in unnamed files, with no path).

    ``close()``, which Flask calls when the request ends, answered or failed, closes and so
    deletes every one, those of a body refused half-way through its parsing included.
    """

    def _get_file_stream(self, total_content_length, content_type, filename=None, content_length=None):
        spooled = tempfile.NamedTemporaryFile(  # noqa: SIM115 (open until close() below, at the request's end)
            prefix="mlexec-upload-", suffix=".part",
            dir=current_app.config["UPLOAD_FOLDER"])
        self.__dict__.setdefault("_spooled", []).append(spooled)
        return spooled

    def close(self) -> None:
        try:
            super().close()
        finally:
            for spooled in self.__dict__.pop("_spooled", ()):
                spooled.close()            # a NamedTemporaryFile deletes itself when closed


class UploadsBusy(Busy):
    """Another uploaded model file was still being imported after the wait (see ``create_app``)."""


def _form_page(form: dict, error: str, status: int = 400):
    model_limits = dict(MODEL_LIMITS, max_model_bytes=current_app.config["MAX_MODEL_BYTES"])
    return render_template("form.html", form=form, error=error, models=list(MODELS),
                           engines=list(ENGINES), limits=LIMITS, model_limits=model_limits), status


def _model_name(filename: str) -> str:
    """The model's name in the results: the uploaded file's stem, as the command line names a file."""
    return Path(secure_filename(filename)).stem or "model"


def _uploaded_model(upload, limit: int):
    """The uploaded ONNX file as a model (None when none was chosen); AnalysisError when bad.

    The file is already on disk (``UploadRequest``): its size is checked with ``fstat`` and the
    importer reads it by path; nothing here reads the upload. External data stays refused, so
    that a file cannot pull other files of the upload folder into the model."""
    if upload is None or not upload.filename:
        return None
    spooled = upload.stream
    spooled.flush()
    size = os.fstat(spooled.fileno()).st_size
    if size > limit:
        raise AnalysisError(f"expected a model file of at most {limit:,} bytes ({limit / 2**20:g} MiB), "
                            f"got {size:,} bytes in {upload.filename!r}")
    return load_model_file(Path(spooled.name), name=_model_name(upload.filename), allow_external_data=False,
                           max_nodes=MODEL_LIMITS["max_nodes"], max_initializer_bytes=limit,
                           max_value_bytes=LIMITS["max_estimated_bytes"] // 8)


def _too_large_message(model_bytes: int | None) -> str:
    """What a request over its limit (``request.max_content_length``) or with a form field over
    ``MAX_FORM_MEMORY_SIZE`` is told, naming the limit it broke."""
    expected = f"at most {LIMITS['max_input_bytes']:,} bytes of input text"
    if model_bytes:
        expected = f"a model file of at most {model_bytes:,} bytes ({model_bytes / 2**20:g} MiB) and {expected}"
    limit, length = request.max_content_length, request.content_length
    if length is not None and limit is not None and length <= limit:
        return f"a form field is larger than {request.max_form_memory_size:,} bytes; expected {expected}"
    return f"the request is larger than {limit:,} bytes; expected {expected}"


def create_app(config: dict | None = None) -> Flask:
    app = Flask(__name__)
    app.request_class = UploadRequest
    app.config.update(
        MAX_CONTENT_LENGTH=TEXT_REQUEST_BYTES,     # POST /analyze raises it by MAX_MODEL_BYTES
        MAX_FORM_MEMORY_SIZE=TEXT_REQUEST_BYTES,
        BASELINES_ROOT=os.environ.get("MLEXEC_BASELINES", "baselines"),
        DEBUG=False,
        **_load_settings(),
    )
    app.config.update(config or {})
    runner = AnalysisRunner(app.config["ANALYSIS_WORKERS"], app.config["ANALYSIS_QUEUE"],
                            app.config["ANALYSIS_TIMEOUT"])
    app.extensions["analysis_runner"] = runner
    retry_after = {"Retry-After": str(app.config["RETRY_AFTER"])}

    # Imports of uploaded files run one at a time: each holds several copies of its file in this
    # process while it runs (docs/analyzer.md), and the analysis queue only bounds what follows.
    importing = threading.Lock()

    def import_upload(upload):
        if not importing.acquire(timeout=app.config["ANALYSIS_TIMEOUT"]):
            raise UploadsBusy(f"the server is importing other model files (waited "
                              f"{app.config['ANALYSIS_TIMEOUT']:g} s)")
        try:
            return _uploaded_model(upload, app.config["MAX_MODEL_BYTES"])
        finally:
            importing.release()

    def busy_message(exc: Busy) -> str:
        busy = str(exc) if isinstance(exc, UploadsBusy) else \
            f"the server is busy ({runner.workers} analyses running, {runner.queue} waiting)"
        return f"{busy}; try again in {app.config['RETRY_AFTER']} s"

    def timeout_message(exc) -> str:
        return f"{exc}; lower repeat, dim or batch, or run fewer engines"

    @app.after_request
    def security_headers(response):
        response.headers.update(SECURITY_HEADERS)
        return response
    app.jinja_env.filters["bytes"] = fmt_bytes
    app.jinja_env.filters["time"] = fmt_time

    @app.get("/")
    def index():
        return _form_page(DEFAULTS, None, 200)

    @app.post("/analyze")
    def analyze():
        request.max_content_length = TEXT_REQUEST_BYTES + app.config["MAX_MODEL_BYTES"]   # before parsing
        form = {key: request.form.get(key, "") for key in ("input", "model", "dim", "batch", "repeat", "seed")}
        form["engines"] = request.form.getlist("engines")
        values = form["input"]
        upload = request.files.get("input_file")
        if upload is not None and upload.filename:
            data = upload.read(LIMITS["max_input_bytes"] + 1)
            values = data   # bytes: run_analysis checks size and UTF-8
            if len(data) > LIMITS["max_input_bytes"]:
                return _form_page(form, f"expected at most {LIMITS['max_input_bytes']:,} bytes of input "
                                        f"text, got more in {upload.filename!r}")
        try:
            model_file = import_upload(request.files.get("model_file"))
            if model_file is not None and isinstance(values, str) and not values.strip():
                values = None                      # a model file runs on a seeded random input
            result = runner.run(values, model=form["model"], dim=form["dim"], batch=form["batch"],
                                engines=form["engines"], repeat=form["repeat"], seed=form["seed"] or 0,
                                model_file=model_file)
        except AnalysisError as exc:
            return _form_page(form, str(exc))
        except Busy as exc:
            page, status = _form_page(form, busy_message(exc), 503)
            return page, status, retry_after
        except TimedOut as exc:
            return _form_page(form, timeout_message(exc), 504)
        return render_template("results.html", result=result, form=form)

    @app.post("/api/analyze")
    def api_analyze():
        body = request.get_json(silent=True)
        if not isinstance(body, dict):
            return jsonify(error="expected a JSON object body like {\"values\": \"1.0, 0.5\", \"dim\": 64} "
                                 "with Content-Type: application/json"), 400
        unknown = sorted(set(body) - API_KEYS)
        if unknown:
            return jsonify(error=f"unknown key(s) {unknown}; expected some of {sorted(API_KEYS)}"), 400
        if "values" not in body:
            return jsonify(error="missing key 'values' (text like \"1.0, 0.5\", a list of numbers, or rows)"), 400
        options = {k: body[k] for k in ("model", "dim", "batch", "engines", "repeat", "seed") if k in body}
        if "dim" not in options:
            options["dim"] = int(DEFAULTS["dim"])
        try:
            return jsonify(runner.run(body["values"], **options))
        except AnalysisError as exc:
            return jsonify(error=str(exc)), 400
        except Busy as exc:
            return jsonify(error=busy_message(exc)), 503, retry_after
        except TimedOut as exc:
            return jsonify(error=timeout_message(exc)), 504

    @app.get("/history")
    def history_page():
        from .. import history

        machine = request.args.get("machine") or None
        data = history.collect(app.config["BASELINES_ROOT"])
        return render_template("history.html", static=False,
                               asset=lambda name: url_for("static", filename=name),
                               machine_href=lambda name: url_for("history_page", machine=name),
                               **history.page_context(data, machine))

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_exc):
        if request.path.startswith("/api/"):
            return jsonify(error=_too_large_message(None)), 400
        model_bytes = app.config["MAX_MODEL_BYTES"] if request.endpoint == "analyze" else None
        return _form_page(DEFAULTS, _too_large_message(model_bytes))

    @app.errorhandler(HTTPException)
    def http_error(exc):
        if request.path.startswith("/api/"):
            return jsonify(error=f"{exc.code} {exc.name}"), exc.code
        return render_template("error.html", code=exc.code, message=exc.name), exc.code

    @app.errorhandler(Exception)
    def unexpected(exc):
        log.exception("unexpected error on %s %s", request.method, request.path)
        if request.path.startswith("/api/"):
            return jsonify(error="internal error; the server log has the details"), 500
        return render_template("error.html", code=500,
                               message="Internal error; the server log has the details."), 500

    return app


app = create_app()
