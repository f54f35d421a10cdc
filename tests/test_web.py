"""The Flask app through its test client: form, results, 400s that keep the form, API, history."""
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
    resp = client.post("/analyze", data=dict(FORM, input="1," * 5_000_000))
    assert resp.status_code == 400
    assert "the request is larger than" in resp.get_data(as_text=True)
    api = client.post("/api/analyze", data=b"[" + b"1," * 5_000_000 + b"1]", content_type="application/json")
    assert api.status_code == 400 and "the request is larger than" in api.get_json()["error"]


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
    import mlexec.web as web

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
