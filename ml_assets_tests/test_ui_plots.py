"""The evaluation's plots render inside the Dagster UI with no MLflow server running: the real
dagster-webserver serves the asset page, headless Chromium opens the `plots_inline` metadata entry
(the Chrome DevTools Protocol, over websocket-client) and every embedded PNG decodes to an image.

Needs Chromium (Debian: `apt-get install chromium`; .ci/run installs it where it can); without it
the test is skipped and says so. The screenshot is left in the test's temporary directory."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from ml_assets.evaluation import plots
from ml_assets.evaluation.summary import plots_markdown
from ml_assets_tests.helpers import cli_env, free_port

CHROMIUM = next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on this machine (apt-get install chromium)")


def wait_for(url: str, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class Browser:
    """One headless Chromium tab driven through the DevTools protocol."""

    def __init__(self, port: int) -> None:
        import websocket

        self.proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu",
                                      f"--remote-debugging-port={port}", "--window-size=1400,1800", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(f"http://127.0.0.1:{port}/json/version", 60)
        tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json"))
        page = next(t for t in tabs if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.calls = 0

    def call(self, method: str, **params) -> dict:
        self.calls += 1
        self.ws.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.calls:
                assert "error" not in message, message
                return message["result"]

    def js(self, expression: str):
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def until(self, expression: str, seconds: float = 90.0):
        deadline = time.monotonic() + seconds
        while not (value := self.js(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.3)
        return value

    def close(self) -> None:
        self.ws.close()
        self.proc.kill()
        self.proc.wait()


def evaluation_plots(out: Path) -> dict[str, bytes]:
    """Real plots of the evaluation's plotting code, on synthetic held-out rows."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 2000)
    preds = {"this model": np.clip(0.35 * y + rng.uniform(0, 0.65, 2000), 0, 1),
             "champion v1": np.clip(0.25 * y + rng.uniform(0, 0.75, 2000), 0, 1)}
    history = [{"epoch": e, "train_loss": 0.6 / e, "val_loss": 0.62 / e + 0.01} for e in range(1, 6)]
    written = [plots.roc_curve_png(y, preds, out / "roc.png"), plots.pr_curve_png(y, preds, out / "precision_recall.png"),
               plots.calibration_png(y, preds, out / "calibration.png"), plots.loss_curves_png(history, out / "loss_curves.png")]
    return {path.name: path.read_bytes() for path in written}


def test_the_plots_render_in_the_dagster_ui_without_mlflow(home, tmp_path):
    images = evaluation_plots(tmp_path)
    key = dg.AssetKey(["flights_delay", "evaluation_report"])
    with dg.DagsterInstance.get() as instance:  # the home's instance, which the webserver reads
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key, partition="2013-01-24", metadata={"plots_inline": dg.MetadataValue.md(plots_markdown(images))}))
    port, debug = free_port(), free_port()
    web = subprocess.Popen([sys.executable, "-m", "dagster_webserver", "-m", "ml_assets", "-h", "127.0.0.1", "-p", str(port)],
                           env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    browser = None
    try:
        wait_for(f"http://127.0.0.1:{port}/server_info")
        browser = Browser(debug)
        browser.call("Page.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/assets/flights_delay/evaluation_report")
        browser.until("[...document.querySelectorAll('tr')].some(r => r.innerText.startsWith('plots_inline'))")
        browser.js("[...document.querySelectorAll('tr')].find(r => r.innerText.startsWith('plots_inline'))"
                   ".querySelector('a').click()")
        shown = browser.until("(() => { const imgs = [...document.images].filter(i => i.src.startsWith('data:image/png'));"
                              " return imgs.length && imgs.every(i => i.complete) &&"
                              " imgs.map(i => [i.alt, i.naturalWidth, i.naturalHeight]); })()")
        shot = tmp_path / "dagster-ui-plots.png"
        shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot", format="png")["data"]))
    finally:
        if browser is not None:
            browser.close()
        web.terminate()
        web.wait(timeout=60)
    # Every plot decoded to a picture of the size it was drawn at, in the order it was embedded.
    assert [alt for alt, _, _ in shown] == [Path(name).stem for name in images]
    assert all(width >= 400 and height >= 300 for _, width, height in shown), shown
    assert shot.stat().st_size > 50_000
