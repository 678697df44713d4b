"""The generated report in a real headless Chromium: it renders with no console errors, every
plot is present and non-empty, and a screenshot is taken (saved next to the test's tmp files).

Chromium comes from the Debian package ``chromium`` (``.ci/run`` installs it when missing);
the test skips, naming the reason, only where no Chromium can be found. The DevTools protocol
(over ``websocket-client``) reports console messages and runs the checks inside the page.
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from PIL import Image

from aisafety.report_page import build_comparison, build_report
from aisafety.store.results import ResultStore

websocket = pytest.importorskip("websocket", reason="websocket-client is in the [test] extra")

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--window-size=1280,2000",
]  # fmt: skip
PLOTS_JS = """(() => {
  const imgs = [...document.querySelectorAll('img.plot')];
  return JSON.stringify({
    expected: Number(document.body.dataset.plots),
    found: imgs.length,
    empty: imgs.filter(i => !i.complete || i.naturalWidth < 50 || i.naturalHeight < 50)
               .map(i => i.alt),
    sections: [...document.querySelectorAll('section.report-section')].map(s => s.id),
  });
})()"""


READER_JS = """(() => {
  const glossary = Object.fromEntries([...document.querySelectorAll('dl.glossary dt')]
    .map(d => [d.id, d.nextElementSibling ? d.nextElementSibling.textContent : '']));
  const names = [...document.querySelectorAll('#metrics table tr td:nth-child(2)')];
  return JSON.stringify({
    glossary: glossary,
    abbrs: [...document.querySelectorAll('abbr.metric')].map(a => ({
      text: a.textContent, title: a.title,
      href: a.closest('a') ? a.closest('a').getAttribute('href') : null})),
    bare: names.filter(td => !td.querySelector('abbr.metric')).map(td => td.textContent),
    cards: document.querySelectorAll('.card').length,
    verdicts: [...document.querySelectorAll('.card p.verdict')].map(p => p.innerText),
  });
})()"""
VERDICT = re.compile(
    r"Verdict: \d+\.\d% robust accuracy \[\d+\.\d, \d+\.\d\] \(95% CI, n=\d+\) at \w+ eps "
    r"[\d.]+, the worst case over \d+ attack\(s\); (all \d+ sanity checks pass|worst sanity "
    r"check: (warn|skip), .+)\."
)


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium on PATH: apt-get install chromium (.ci/run does, as root)")


class Browser:
    """One headless Chromium with a fresh profile, driven over the DevTools protocol."""

    def __init__(self, profile: Path):
        self.process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            start_new_session=True,  # /usr/bin/chromium is a shell wrapper: stop its group
        )  # fmt: skip
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 600  # a hang guard
        while not port_file.is_file() or not port_file.read_text().strip():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"chromium did not start: {self.process.stderr.read()}")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        import urllib.request

        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(
            page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True
        )
        self.next_id = 0
        self.events: list[dict] = []
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.call(domain)

    def call(self, method: str, **params) -> dict:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]
            self.events.append(message)

    def open(self, path: Path) -> None:
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + 600  # a hang guard
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not finish loading")
            self.events.append(json.loads(self.ws.recv()))

    def evaluate(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"][
            "value"
        ]

    def console_errors(self) -> list[str]:
        errors = []
        for e in self.events:
            method, p = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                errors.append(" ".join(str(a.get("value", a)) for a in p["args"]))
            elif method == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("text", "exception"))
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                errors.append(p["entry"]["text"])
        return errors

    def screenshot(self, path: Path) -> Image.Image:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))
        return Image.open(io.BytesIO(path.read_bytes()))

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def browser(tmp_path):
    b = Browser(tmp_path / "profile")
    yield b
    b.close()


def check_page(browser: Browser, html_file: Path, shot: Path) -> dict:
    browser.open(html_file)
    state = json.loads(browser.evaluate(PLOTS_JS))
    image = browser.screenshot(shot)
    assert image.width >= 1000 and image.height >= 1000
    # the screenshot is not blank: the page drew text and figures in many shades
    assert len(image.convert("L").getcolors(maxcolors=1 << 16) or range(1 << 16)) > 50
    return state


def test_report_renders_in_chromium(report_db, browser, tmp_path):
    url, run_id = report_db
    page = tmp_path / "report.html"
    page.write_text(build_report(ResultStore(url), run_id))
    state = check_page(browser, page, tmp_path / "report.png")
    assert browser.console_errors() == []
    assert state["found"] == state["expected"] == 6
    assert state["empty"] == []
    sections = {"provenance", "sanity", "curves", "corruptions", "certified", "frontier"}
    assert sections | {"examples", "glossary"} <= set(state["sections"])
    reader = json.loads(browser.evaluate(READER_JS))
    # every metric abbreviation on the page has its expansion and a glossary entry
    assert reader["bare"] == [] and reader["abbrs"], reader
    for abbr in reader["abbrs"]:
        assert abbr["title"].strip(), abbr
        assert abbr["href"] and abbr["href"][1:] in reader["glossary"], abbr
    assert all("docs/metrics.md" in text for text in reader["glossary"].values())
    # one quotable verdict line per model
    assert len(reader["verdicts"]) == reader["cards"] >= 1
    assert all(VERDICT.fullmatch(v.strip()) for v in reader["verdicts"]), reader["verdicts"]


def test_comparison_renders_in_chromium(report_db, browser, tmp_path):
    url, run_id = report_db
    page = tmp_path / "compare.html"
    page.write_text(build_comparison(ResultStore(url), [run_id]))
    state = check_page(browser, page, tmp_path / "compare.png")
    assert browser.console_errors() == []
    assert state["found"] == state["expected"] >= 3 and state["empty"] == []


def test_the_check_sees_console_errors_and_broken_plots(report_db, browser, tmp_path):
    """The two failures the test above looks for are caught when they happen."""
    url, run_id = report_db
    html = build_report(ResultStore(url), run_id)
    html = html.replace("</body>", "<script>console.error('planted error')</script></body>")
    html = re.sub(r'src="data:image/png;base64,[^"]{100}', 'src="data:image/png;base64,AAAA', html,
                  count=1)  # fmt: skip
    page = tmp_path / "broken.html"
    page.write_text(html)
    state = check_page(browser, page, tmp_path / "broken.png")
    assert "planted error" in " ".join(browser.console_errors())
    assert len(state["empty"]) == 1
