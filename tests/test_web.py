"""The Flask app through its test client: form, results, 400s that keep the form, API, history,
uploaded model files."""
from pathlib import Path

import pytest

from conftest import FIXTURES
from mlexec.web import create_app

FORM = {"input": "0.25, -1.5", "model": "mlp", "dim": "48", "batch": "3", "repeat": "2", "seed": "7",
        "engines": ["naive", "arena"]}


@pytest.fixture
def client():
    return create_app({"BASELINES_ROOT": str(FIXTURES / "baselines")}).test_client()


def test_form_page(client):
    page = client.get("/").get_data(as_text=True)
    assert '<form method="post" action="/analyze"' in page
    for name in ("input", "model", "dim", "batch", "repeat", "engines", "input_file"):
        assert f'name="{name}"' in page
    for engine in ("naive", "static", "arena"):
        assert f'value="{engine}"' in page
    assert "estimated compute &le; 60 s" in page


def test_results_page_has_table_and_charts(client):
    resp = client.post("/analyze", data=FORM)
    assert resp.status_code == 200
    page = resp.get_data(as_text=True)
    assert "dim=48, batch=3, input shape 3×48" in page
    assert 'data-engine="naive"' in page and 'data-engine="arena"' in page and 'data-engine="static"' not in page
    for chart in ("chart-memory", "chart-latency", "chart-ops"):
        assert f'id="{chart}"' in page
    assert page.count('class="bar-row"') == 2 + 2 + 3   # 2 engines twice, 3 ops of the mlp


def test_a_peers_memory_is_left_out_of_the_table_and_chart(client):
    page = client.post("/analyze", data=dict(FORM, engines=["naive", "onnxruntime"])).get_data(as_text=True)
    if 'data-engine="onnxruntime"><td>onnxruntime</td><td colspan' in page:
        pytest.skip("onnxruntime unavailable here (the peers extra)")
    row = page[page.index('data-engine="onnxruntime"'):].split("</tr>")[0]
    assert row.count("<td>-</td>") == 3                 # peak, activations, memory saved
    chart = page[page.index('id="chart-memory"'):].split("<h2>")[0]
    assert "onnxruntime" not in chart and "Not shown: onnxruntime" in page


def test_uploaded_csv_is_used(client):
    import io
    data = dict(FORM, input="", input_file=(io.BytesIO(b"1\n2\n3\n"), "data.csv"))
    page = client.post("/analyze", data=data, content_type="multipart/form-data").get_data(as_text=True)
    assert "from 3 value(s)" in page


@pytest.mark.parametrize("field, value, message", [
    ("input", "1, abc", "expected a number at position 2, got text &#39;abc&#39;"),
    ("input", "", "got empty input"),
    ("input", "1,,2", "got an empty value"),
    ("batch", "999999", "expected batch to be an integer in 1..1024"),
    ("dim", "-3", "expected dim to be an integer in 1..4096, got -3"),
    ("model", "resnet", "unknown model &#39;resnet&#39;"),
    ("engines", [], "expected at least one engine"),
])
def test_bad_form_input_is_400_and_keeps_values(client, field, value, message):
    resp = client.post("/analyze", data=dict(FORM, **{field: value}))
    assert resp.status_code == 400
    page = resp.get_data(as_text=True)
    assert message in page and 'id="error"' in page
    if field != "input":
        assert "0.25, -1.5</textarea>" in page
    if field != "dim":
        assert 'name="dim" value="48"' in page
    assert 'value="arena" checked' in page or field == "engines"
    assert "Traceback" not in page


def test_oversized_request_is_a_clear_400(client):
    from mlexec.web import TEXT_REQUEST_BYTES

    resp = client.post("/analyze", data=dict(FORM, input="1," * 5_000_000))
    assert resp.status_code == 400
    assert (f"a form field is larger than {TEXT_REQUEST_BYTES:,} bytes; expected a model file of at most "
            f"134,217,728 bytes (128 MiB) and at most 1,000,000 bytes of input text") in resp.get_data(as_text=True)
    api = client.post("/api/analyze", data=b"[" + b"1," * 5_000_000 + b"1]", content_type="application/json")
    assert api.status_code == 400       # the API takes no model file: its body is held to the text's limit
    assert api.get_json()["error"] == (f"the request is larger than {TEXT_REQUEST_BYTES:,} bytes; "
                                       f"expected at most 1,000,000 bytes of input text")


def test_json_api(client):
    resp = client.post("/api/analyze", json={"values": [1, 2, 3], "dim": 32, "repeat": 2, "engines": ["naive", "static"]})
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["model"]["input_shape"] == [1, 32] and [e["name"] for e in body["engines"]] == ["naive", "static"]
    assert body["engines"][1]["speedup_vs_naive"] == pytest.approx(
        body["engines"][0]["median_s"] / body["engines"][1]["median_s"])


@pytest.mark.parametrize("kwargs, message", [
    ({"json": {"values": "x"}}, "expected a number at position 1, got text 'x'"),
    ({"json": {"values": "1", "dim": 10**7}}, "expected dim to be an integer"),
    ({"json": {"dim": 8}}, "missing key 'values'"),
    ({"json": {"values": "1", "colour": "red"}}, "unknown key(s) ['colour']"),
    ({"json": [1, 2]}, "expected a JSON object body"),
    ({"data": "{not json", "content_type": "application/json"}, "expected a JSON object body"),
])
def test_json_api_bad_input_is_400(client, kwargs, message):
    resp = client.post("/api/analyze", **kwargs)
    assert resp.status_code == 400
    assert message in resp.get_json()["error"]


def test_unexpected_error_is_500_without_traceback(monkeypatch):
    from mlexec import web

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(web.AnalysisRunner, "run", boom)
    client = create_app().test_client()
    resp = client.post("/analyze", data=FORM)
    assert resp.status_code == 500
    page = resp.get_data(as_text=True)
    assert "Internal error" in page and "secret internals" not in page and "Traceback" not in page


def test_history_page(client):
    resp = client.get("/history?machine=Linux-CPython-3.11-64bit")
    assert resp.status_code == 200
    page = resp.get_data(as_text=True)
    assert 'id="steps"' in page and "<code>c3d4e5f6</code>" in page
    assert page.count('<figure class="chart"') == 2   # one chart per benchmark
    assert 'href="/history?machine=other-machine"' in page
    assert "style=" not in page and "<script>" not in page   # works under a strict Content-Security-Policy
    assert client.get("/static/history.js").status_code == 200
    assert 'id="error"' in client.get("/history?machine=nope").get_data(as_text=True)


def test_history_page_shows_the_rest_and_names_a_bad_file(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "baselines", tmp_path, dirs_exist_ok=True)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "0001_r.json").write_text("{oops")
    client = create_app({"BASELINES_ROOT": str(tmp_path)}).test_client()
    resp = client.get("/history")
    page = resp.get_data(as_text=True)
    assert resp.status_code == 200 and 'id="skipped"' in page and "0001_r.json: invalid JSON" in page
    assert 'figure class="chart' in page or "<figure" in page     # the readable runs still shown
    empty = create_app({"BASELINES_ROOT": str(tmp_path / "none")}).test_client().get("/history")
    assert 'id="empty"' in empty.get_data(as_text=True)


def test_served_app_logs_one_line_per_request(caplog):
    from werkzeug.test import Client

    from mlexec.web.__main__ import access_log

    client = Client(access_log(create_app()))
    with caplog.at_level("INFO", logger="mlexec.web.access"):
        client.get("/history?machine=nope")
        client.get("/missing")
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert '"GET /history?machine=nope" 200 ' in lines[0] and lines[0].endswith(" ms")
    assert '"GET /missing" 404' in lines[1]


# --- load limits and headers -------------------------------------------------------

SLOW = {"values": "1", "dim": 32, "repeat": 2, "engines": ["naive", "static", "arena"]}   # ~2 s of settling


def test_over_budget_is_a_400_saying_what_to_lower(client):
    resp = client.post("/api/analyze", json={"values": "1", "dim": 2048, "batch": 256, "repeat": 500,
                                             "engines": ["naive", "static", "arena", "fused", "torch-compile"]})
    assert resp.status_code == 400
    assert "s of compute or less" in resp.get_json()["error"] and "lower repeat to" in resp.get_json()["error"]


def test_full_queue_is_503_with_retry_after():
    import threading

    app = create_app({"ANALYSIS_WORKERS": 1, "ANALYSIS_QUEUE": 0, "RETRY_AFTER": 7})
    runner = app.extensions["analysis_runner"]
    first = []
    thread = threading.Thread(target=lambda: first.append(app.test_client().post("/api/analyze", json=SLOW)))
    thread.start()
    while runner.admitted == 0 and thread.is_alive():
        threading.Event().wait(0.005)
    resp = app.test_client().post("/api/analyze", json=SLOW)
    page = app.test_client().post("/analyze", data=FORM)
    thread.join()
    assert first[0].status_code == 200
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "7"
    assert "the server is busy (1 analyses running, 0 waiting); try again in 7 s" in resp.get_json()["error"]
    assert page.status_code == 503 and page.headers["Retry-After"] == "7"
    text = page.get_data(as_text=True)
    assert "the server is busy" in text and "0.25, -1.5</textarea>" in text    # the form kept


def test_past_the_timeout_the_analysis_is_killed_and_answers_504():
    import multiprocessing

    client = create_app({"ANALYSIS_TIMEOUT": 0.5}).test_client()
    resp = client.post("/api/analyze", json=SLOW)
    assert resp.status_code == 504
    assert "past the 0.5 s limit, and was stopped; lower repeat" in resp.get_json()["error"]
    assert not multiprocessing.active_children()             # the worker process is gone


@pytest.mark.parametrize("method, path, status", [
    ("get", "/", 200), ("get", "/history", 200), ("get", "/nowhere", 404), ("post", "/api/analyze", 400),
    ("post", "/analyze", 400), ("get", "/api/analyze", 405),
])
def test_security_headers_on_every_response(client, method, path, status):
    resp = getattr(client, method)(path)
    assert resp.status_code == status
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"
    assert resp.headers["Referrer-Policy"] == "no-referrer"
    csp = dict(part.strip().split(" ", 1) for part in resp.headers["Content-Security-Policy"].split(";"))
    assert csp["default-src"] == "'none'" and csp["script-src"] == "'self'"   # no inline or foreign script
    assert csp["frame-ancestors"] == "'none'" and csp["form-action"] == "'self'"


# --- model files: spooled to disk, imported by path, deleted after the request ------------

def _gemm_file(rows: int, cols: int) -> bytes:
    """y = x @ W + b with a (rows, cols) float32 weight: rows * cols * 4 bytes of initializer,
    few flops at batch 1."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="gemm")], "wide",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", cols])],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.zeros(cols, np.float32), "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


MODEL_FORM = {"input": "", "model": "mlp", "dim": "16", "batch": "1", "repeat": "2", "seed": "0",
              "engines": ["naive"]}


@pytest.fixture
def uploads(tmp_path):
    """An app whose uploads go to a folder of their own, and that folder (empty after each request)."""
    folder = tmp_path / "uploads"
    folder.mkdir()
    return create_app({"UPLOAD_FOLDER": str(folder)}), folder


def _post_model(client, data: bytes, name: str = "wide.onnx", **form):
    import io
    return client.post("/analyze", data=dict(MODEL_FORM, model_file=(io.BytesIO(data), name), **form),
                       content_type="multipart/form-data")


def test_a_model_above_the_old_8_mib_limit_is_imported_from_its_spooled_file(uploads, monkeypatch):
    from mlexec import web

    app, folder = uploads
    data = _gemm_file(1536, 2048)                     # a 12 MiB weight
    assert len(data) > 8 * 2**20
    streams, seen = [], []
    spool = web.UploadRequest._get_file_stream

    class Counted:                                    # the spooled file, counting what is read from it
        def __init__(self, stream):
            self.stream, self.bytes_read = stream, 0

        def read(self, size=-1):
            chunk = self.stream.read(size)
            self.bytes_read += len(chunk)
            return chunk

        def __getattr__(self, name):
            return getattr(self.stream, name)

    def counted(self, *args, **kwargs):
        streams.append(Counted(spool(self, *args, **kwargs)))
        return streams[-1]

    def spy(source, **limits):
        seen.append((source, source.stat().st_size, sorted(p.name for p in folder.iterdir()), limits["name"]))
        return load(source, **limits)

    load = web.load_model_file
    monkeypatch.setattr(web.UploadRequest, "_get_file_stream", counted)
    monkeypatch.setattr(web, "load_model_file", spy)
    resp = _post_model(app.test_client(), data)
    page = resp.get_data(as_text=True)
    assert resp.status_code == 200, page
    assert "Model <strong>wide</strong>, batch=1, input shape 1×1536" in page and "all engines within" in page
    [(source, size, files, name)] = seen
    assert source.parent == folder and files == [source.name] and size == len(data) and name == "wide"
    assert [s.bytes_read for s in streams] == [0]     # the server never read the upload: the importer read the path
    assert list(folder.iterdir()) == []               # deleted when the request ended


def test_a_bad_model_file_is_the_importers_400_and_its_file_is_deleted(uploads):
    app, folder = uploads
    resp = _post_model(app.test_client(), b"\x08\x07" + b"not a model" * 100_000, name="junk.onnx")
    page = resp.get_data(as_text=True)
    assert resp.status_code == 400 and "cannot use this model file: not an ONNX file" in page
    assert 'id="error"' in page and list(folder.iterdir()) == []


def test_the_spooled_file_is_deleted_after_a_failed_request(uploads, monkeypatch):
    from mlexec import web

    app, folder = uploads

    def boom(*args, **kwargs):
        raise RuntimeError("secret internals")

    monkeypatch.setattr(web.AnalysisRunner, "run", boom)
    resp = _post_model(app.test_client(), _gemm_file(64, 32))
    assert resp.status_code == 500 and "secret internals" not in resp.get_data(as_text=True)
    assert list(folder.iterdir()) == []


def test_a_body_refused_half_way_deletes_the_files_already_spooled(uploads, monkeypatch):
    """No Content-Length (a chunked upload): the limit is found while parsing, after the model
    file's part was written to disk."""
    import io

    from werkzeug.datastructures import FileStorage
    from werkzeug.test import encode_multipart

    from mlexec import web

    app, folder = uploads
    app.config["MAX_MODEL_BYTES"] = 2**20
    model = _gemm_file(64, 32)
    boundary, body = encode_multipart({"model_file": FileStorage(io.BytesIO(model), "m.onnx"),
                                       "input_file": FileStorage(io.BytesIO(b"1," * (3 * 2**20)), "big.csv")})
    spool, spooled = web.UploadRequest._get_file_stream, []

    def recorded(self, *args, **kwargs):          # keeps each file object alive: no deletion by refcount
        if spooled:                                   # the second part: the first one is on disk by now
            assert Path(spooled[0].name).stat().st_size == len(model)
        spooled.append(spool(self, *args, **kwargs))
        return spooled[-1]

    monkeypatch.setattr(web.UploadRequest, "_get_file_stream", recorded)
    resp = app.test_client().post("/analyze", input_stream=io.BytesIO(body),
                                  content_type=f"multipart/form-data; boundary={boundary}",
                                  environ_overrides={"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True})
    assert resp.status_code == 400
    assert (f"the request is larger than {web_limit(app):,} bytes; expected a model file of at most "
            f"1,048,576 bytes (1 MiB) and at most 1,000,000 bytes of input text") in resp.get_data(as_text=True)
    assert len(spooled) == 2 and all(stream.closed for stream in spooled)
    assert list(folder.iterdir()) == []


def web_limit(app) -> int:
    from mlexec.web import TEXT_REQUEST_BYTES
    return TEXT_REQUEST_BYTES + app.config["MAX_MODEL_BYTES"]


def test_a_too_large_model_file_is_a_clear_400_naming_the_limit(uploads):
    app, folder = uploads
    app.config["MAX_MODEL_BYTES"] = 2**20
    client = app.test_client()
    over_request = _post_model(client, b"\0" * (5 * 2**20))          # over the request's limit: not read
    assert over_request.status_code == 400
    assert (f"the request is larger than {web_limit(app):,} bytes; expected a model file of at most "
            f"1,048,576 bytes (1 MiB)") in over_request.get_data(as_text=True)
    over_file = _post_model(client, b"\0" * (2**20 + 1), name="big.onnx")   # within it, but over the file's
    assert over_file.status_code == 400
    assert ("expected a model file of at most 1,048,576 bytes (1 MiB), got 1,048,577 bytes in &#39;big.onnx&#39;"
            in over_file.get_data(as_text=True))
    assert list(folder.iterdir()) == []


def test_the_model_file_limit_is_a_setting_stated_on_the_form(monkeypatch):
    assert "An ONNX model file: at most 128 MiB" in create_app().test_client().get("/").get_data(as_text=True)
    monkeypatch.setenv("MLEXEC_MAX_MODEL_BYTES", str(32 * 2**20))
    app = create_app()
    assert app.config["MAX_MODEL_BYTES"] == 32 * 2**20
    assert "An ONNX model file: at most 32 MiB" in app.test_client().get("/").get_data(as_text=True)


def test_one_model_file_is_imported_at_a_time(uploads, monkeypatch):
    """A second upload waits for the first one's import, at most ANALYSIS_TIMEOUT, then is a 503."""
    import threading

    from mlexec import web
    from mlexec.analysis import AnalysisError

    folder = uploads[1]
    app = create_app({"UPLOAD_FOLDER": str(folder), "ANALYSIS_TIMEOUT": 0.2, "RETRY_AFTER": 3})
    started, release = threading.Event(), threading.Event()

    def slow(source, **limits):
        started.set()
        release.wait(10)
        raise AnalysisError("cannot use this model file: stand-in")

    monkeypatch.setattr(web, "load_model_file", slow)
    first = []
    thread = threading.Thread(target=lambda: first.append(_post_model(app.test_client(), b"first")))
    thread.start()
    assert started.wait(10)
    second = _post_model(app.test_client(), b"second")
    release.set()
    thread.join()
    assert first[0].status_code == 400 and "stand-in" in first[0].get_data(as_text=True)
    assert second.status_code == 503 and second.headers["Retry-After"] == "3"
    assert ("the server is importing other model files (waited 0.2 s); try again in 3 s"
            in second.get_data(as_text=True))
    assert list(folder.iterdir()) == []


def test_a_quantized_engine_is_shown_against_its_own_bar(client):
    from engines import ENGINES, EngineUnavailable, MODELS
    try:
        ENGINES["onnxruntime-int8"](MODELS["mlp"](dim=8), 1)
    except EngineUnavailable as exc:
        pytest.skip(str(exc))
    page = client.post("/analyze", data=dict(FORM, engines=["naive", "onnxruntime-int8"])).get_data(as_text=True)
    bar = ENGINES["onnxruntime-int8"].abs_tol
    assert f"quantized, bar {bar}" in page
    assert f"quantized: onnxruntime-int8 within its own bar, {bar}" in page
    # over its bar: the verdict fails, naming the engine and its bar (rendered from such a result)
    app = create_app({"BASELINES_ROOT": str(FIXTURES / "baselines")})
    from mlexec.analysis import run_analysis
    result = run_analysis("0.25, -1.5", engines=["naive", "onnxruntime-int8"], dim=48, repeat=2)
    result["engines"][1].update(tolerance=1e-3, passed=False)
    result["all_passed"] = False
    with app.test_request_context():
        from flask import render_template
        page = render_template("results.html", result=result, form=dict(FORM))
    assert "FAILED: onnxruntime-int8 off by" in page and "over its own bar (quantized) 0.001" in page
    assert "FAIL (&gt; 0.001)" in page or "FAIL (> 0.001)" in page
