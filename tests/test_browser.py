"""The web app in a real headless Chromium (Debian's /usr/bin/chromium via Playwright)."""
import threading
from pathlib import Path

import pytest

from conftest import FIXTURES

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = pytest.mark.skipif(not CHROMIUM.exists(),
                                reason="/usr/bin/chromium is missing (install it: apt-get install chromium)")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def server():
    from werkzeug.serving import make_server

    from mlexec.web import create_app

    srv = make_server("127.0.0.1", 0, create_app({"BASELINES_ROOT": str(FIXTURES / "baselines")}), threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield browser
        browser.close()


def test_submit_form_and_read_results(server, browser, tmp_path):
    page = browser.new_page()
    page.goto(server + "/")
    page.fill("#input", "0.5, -0.25, 1")
    page.fill("#dim", "40")
    page.fill("#batch", "2")
    page.fill("#repeat", "2")
    page.uncheck("input[name=engines][value=static]")
    page.click("#submit")
    page.wait_for_selector("#result-table")
    assert "dim=40, batch=2, input shape 2×40" in page.inner_text("#summary")
    rows = page.locator("#result-table tr[data-engine]")
    assert rows.count() == 2
    assert [rows.nth(i).get_attribute("data-engine") for i in range(2)] == ["naive", "arena"]
    assert rows.nth(1).locator("td").last.inner_text() == "pass"
    assert page.locator("#chart-ops .bar-row").count() == 3
    page.screenshot(path=str(tmp_path / "results.png"), full_page=True)
    assert (tmp_path / "results.png").stat().st_size > 1000


def test_bad_input_shows_error_and_keeps_values(server, browser, tmp_path):
    page = browser.new_page()
    page.goto(server + "/")
    page.fill("#input", "1, two, 3")
    page.fill("#dim", "40")
    page.click("#submit")
    page.wait_for_selector("#error")
    assert "expected a number at position 2, got text 'two'" in page.inner_text("#error")
    assert page.input_value("#input") == "1, two, 3"
    assert page.input_value("#dim") == "40"
    page.screenshot(path=str(tmp_path / "error.png"))
    assert (tmp_path / "error.png").stat().st_size > 1000


def test_history_page_charts_and_filter(browser, tmp_path_factory):
    """The saved runs' history at 1280 x 800: no horizontal scroll, a chart per benchmark, a working filter.

    The screenshot is kept in pytest's temporary directory (history-*/history.png under
    ``pytest --basetemp`` or /tmp/pytest-of-<user>/) for a person to look at."""
    from werkzeug.serving import make_server

    from conftest import ROOT
    from mlexec import history
    from mlexec.web import create_app

    expected = len(history.collect(ROOT / "baselines").machine(None).series)
    srv = make_server("127.0.0.1", 0, create_app({"BASELINES_ROOT": str(ROOT / "baselines")}), threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))   # a script error in the filter
        assert page.goto(f"http://127.0.0.1:{srv.server_port}/history").status == 200
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        charts = page.locator("figure.chart")
        assert charts.count() == expected > 40
        names = {charts.nth(i).get_attribute("data-benchmark") for i in range(charts.count())}
        assert len(names) == expected   # one chart each
        assert page.inner_text("#shown") == f"{expected} of {expected} charts shown"
        page.select_option("#f-engine", "arena")
        page.select_option("#f-batch", "1")
        visible = page.locator("figure.chart:visible")
        assert {visible.nth(i).inner_text().split("\n")[0] for i in range(visible.count())} == {
            "arena · mlp · b1 · d256", "arena · mlp · b1 · d1024", "arena · transformer · b1 · d256 · s64"}
        assert page.locator("#steps tbody tr:visible").count() < page.locator("#steps tbody tr").count()
        page.select_option("#f-engine", "")
        page.select_option("#f-batch", "")
        assert page.locator("figure.chart:visible").count() == expected
        assert errors == []
        shot = tmp_path_factory.mktemp("history") / "history.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        srv.shutdown()
        thread.join(timeout=10)


# --- the pages under their Content-Security-Policy ---------------------------------

def csp_errors(page) -> list[str]:
    """Console errors Chromium logs for CSP violations on this page, collected from now on."""
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text)
            if msg.type == "error" and "Content Security Policy" in msg.text else None)
    return errors


def test_results_page_renders_its_styles_and_charts_under_the_csp(server, browser):
    page = browser.new_page()
    errors = csp_errors(page)
    response = page.goto(server + "/")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    assert "monospace" in page.eval_on_selector("#input", "e => getComputedStyle(e).fontFamily")  # <style> applied
    page.fill("#input", "0.5, -0.25, 1")
    page.fill("#dim", "40")
    page.fill("#repeat", "2")
    page.click("#submit")                                    # form-action 'self'
    page.wait_for_selector("#result-table")
    widths = page.eval_on_selector_all("#chart-latency .bar", "bars => bars.map(b => b.getBoundingClientRect().width)")
    assert len(widths) == 3 and max(widths) > 50               # style="width:..%" applied
    assert page.eval_on_selector(".bar", "e => getComputedStyle(e).backgroundColor") == "rgb(74, 123, 208)"
    assert errors == []


def test_history_svg_charts_render_under_the_csp(server, browser):
    page = browser.new_page()
    errors = csp_errors(page)
    page.goto(server + "/history")
    boxes = page.eval_on_selector_all("figure.chart svg", "svgs => svgs.map(s => s.getBoundingClientRect().height)")
    assert len(boxes) >= 2 and min(boxes) > 40
    assert page.inner_text("#shown") == f"{len(boxes)} of {len(boxes)} charts shown"   # the filter script ran
    assert errors == []


def test_the_check_sees_a_csp_violation(server, browser):
    """A script the policy refuses (from another origin) is logged, and the listener above catches it."""
    page = browser.new_page()
    errors = csp_errors(page)
    page.goto(server + "/")
    page.evaluate("""() => { const s = document.createElement('script'); s.src = 'http://127.0.0.2:9/x.js';
                             document.body.appendChild(s); }""")
    page.wait_for_timeout(200)
    assert errors and ("default-src" in errors[0] or "script-src" in errors[0])
