"""The analyzer's web face: a form, a results page with charts, a history page, a JSON API.

``create_app()`` builds the Flask app; ``app`` is the module-level instance
for ``waitress-serve --host 0.0.0.0 --port $PORT mlexec.web:app``. Every
analysis goes through ``mlexec.analysis.run_analysis``; bad input is a 400
(the form page again, with the user's values and the error, or
``{"error": ...}`` from the API), never a 500. Requests larger than
``MAX_CONTENT_LENGTH`` get the same 400-style message instead of a bare 413.
"""
from __future__ import annotations

import logging
import os

from flask import Flask, jsonify, render_template, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from engines import ENGINES, MODELS

from ..analysis import DEFAULT_ENGINES, LIMITS, AnalysisError, load_model_file, run_analysis
from ..baselines import BaselineError
from ..units import fmt_bytes

# An uploaded ONNX model (stated on the form): one file, no external data, at most this many
# bytes and graph nodes, checked before any engine is built.
MODEL_LIMITS = {"max_model_bytes": 8 * 2**20, "max_nodes": 2000}
# Room for the largest accepted input text and model file plus the other fields and encoding overhead.
MAX_REQUEST_BYTES = LIMITS["max_input_bytes"] + MODEL_LIMITS["max_model_bytes"] + 64 * 1024

DEFAULTS = {"input": "1.0, 0.5", "model": "mlp", "dim": "256", "batch": "1", "repeat": "20",
            "seed": "0", "engines": list(DEFAULT_ENGINES)}
API_KEYS = {"values", "model", "dim", "batch", "engines", "repeat", "seed"}

log = logging.getLogger("mlexec.web")



def _form_page(form: dict, error: str, status: int = 400):
    return render_template("form.html", form=form, error=error, models=list(MODELS),
                           engines=list(ENGINES), limits=LIMITS, model_limits=MODEL_LIMITS), status


def _uploaded_model(upload):
    """The uploaded ONNX file as a model (None when none was chosen); AnalysisError when bad."""
    if upload is None or not upload.filename:
        return None
    limit = MODEL_LIMITS["max_model_bytes"]
    data = upload.read(limit + 1)
    if len(data) > limit:
        raise AnalysisError(f"expected a model file of at most {limit:,} bytes, got more in {upload.filename!r}")
    return load_model_file(data, allow_external_data=False, max_nodes=MODEL_LIMITS["max_nodes"],
                           max_initializer_bytes=limit, max_value_bytes=LIMITS["max_estimated_bytes"] // 8)


def _too_large_message() -> str:
    return (f"the request is larger than {MAX_REQUEST_BYTES:,} bytes; expected at most "
            f"{LIMITS['max_input_bytes']:,} bytes of input text")


def create_app(config: dict | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(
        MAX_CONTENT_LENGTH=MAX_REQUEST_BYTES,
        MAX_FORM_MEMORY_SIZE=MAX_REQUEST_BYTES,
        BASELINES_ROOT=os.environ.get("MLEXEC_BASELINES", "baselines"),
        DEBUG=False,
    )
    app.config.update(config or {})
    app.jinja_env.filters["bytes"] = fmt_bytes
    app.jinja_env.filters["ms"] = lambda s: "-" if s is None else f"{s * 1e3:.4f} ms"

    @app.get("/")
    def index():
        return _form_page(DEFAULTS, None, 200)

    @app.post("/analyze")
    def analyze():
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
            model_file = _uploaded_model(request.files.get("model_file"))
            if model_file is not None and isinstance(values, str) and not values.strip():
                values = None                      # a model file runs on a seeded random input
            result = run_analysis(values, model=form["model"], dim=form["dim"], batch=form["batch"],
                                  engines=form["engines"], repeat=form["repeat"], seed=form["seed"] or 0,
                                  model_file=model_file)
        except AnalysisError as exc:
            return _form_page(form, str(exc))
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
            return jsonify(run_analysis(body["values"], **options))
        except AnalysisError as exc:
            return jsonify(error=str(exc)), 400

    @app.get("/history")
    def history_page():
        from .. import history

        machine = request.args.get("machine") or None
        root = app.config["BASELINES_ROOT"]
        try:
            commits, series = history.collect(root, machine)
        except BaselineError as exc:
            return render_template("history.html", error=str(exc), root=root, table=None, charts=[]), 200
        charts = history.chart_svgs(series) if series else []
        table = history.format_table(commits, series) if series else None
        return render_template("history.html", error=None, root=root, table=table, charts=charts,
                               machine=machine, series=series)

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(_exc):
        if request.path.startswith("/api/"):
            return jsonify(error=_too_large_message()), 400
        return _form_page(DEFAULTS, _too_large_message())

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
