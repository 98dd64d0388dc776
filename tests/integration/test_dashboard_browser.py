"""The dashboard served by ``streamlit run`` and drawn by headless Chromium (Debian ``chromium``).

Starts the app on a store filled by a real micro-zoo sweep, loads the Pareto page in headless
Chromium, and checks the screenshot: the plot area is not blank and the policies' trace
colours are drawn. On a store whose pair has a draft model and a lookup, the rendered page's
DOM names each policy once per draft kind in the Pareto legend. Chromium takes the screenshot
when its virtual-time budget runs out, which can come within a second or two of real time: on a
busy machine the server's first script runs (their imports included) have not drawn the charts
by then, and the screenshot shows Streamlit's loading skeleton. So a screenshot without charts
is retried after a real-time pause, until one shows them or ``SCREENSHOT_DEADLINE_S`` has
passed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest
from PIL import Image
from support.dashboard_seed import seed_draft_kinds_sweep, seed_real_sweep, seed_synthetic_batches
from support.paths import REPO

from dashboard.charts import PALETTE, POLICY_ORDER
from workers.model_spec import free_port

T = TypeVar("T")

pytestmark = pytest.mark.ray

APP = REPO / "dashboard" / "app.py"
WINDOW = (1400, 1000)
#: Left edge of the main area (the sidebar is about 300 px wide at this window size).
MAIN_AREA_LEFT = 320
VIRTUAL_TIME_BUDGET_MS = 60_000
#: Real time within which a screenshot must show the charts (retried with growing pauses).
SCREENSHOT_DEADLINE_S = 90
RETRY_PAUSES_S = (2, 4, 8, 15)
SERVER_START_TIMEOUT_S = 90
COLOUR_TOLERANCE = 24
MIN_TRACE_PIXELS = 40
MIN_COLOURED_PIXELS = 300
#: Width of the legend at the right of the main area (left of it: the plot itself).
LEGEND_WIDTH = 220
DRAWN_POLICIES = ("static", "adaedl", "svip")


@pytest.fixture(scope="module")
def real_url(micro_zoo, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store filled by a real sweep, shared with the AppTest module (run once a session)."""
    url = f"sqlite:///{tmp_path_factory.getbasetemp() / 'dashboard-real.db'}"
    seed_real_sweep(url, micro_zoo.root)
    return url


@pytest.fixture
def served_app(real_url: str, tmp_path: Path):
    """Yield the URL of ``streamlit run dashboard/app.py`` on the real store (localhost only)."""
    with serving(real_url, tmp_path) as url:
        yield url


@pytest.fixture
def served_drafts_app(tmp_path: Path):
    """Yield the URL of the app on a store whose pair has a draft model and a lookup."""
    url = f"sqlite:///{tmp_path / 'drafts.db'}"
    seed_draft_kinds_sweep(url)
    with serving(url, tmp_path) as app_url:
        yield app_url


@contextmanager
def serving(store_url: str, tmp_path: Path) -> Iterator[str]:
    """Yield the URL of ``streamlit run dashboard/app.py`` on ``store_url`` (localhost only)."""
    port = free_port("127.0.0.1")
    log = (tmp_path / "streamlit.log").open("w")
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.headless",
        "true",
        "--server.address",
        "127.0.0.1",
        "--server.port",
        str(port),
        "--browser.gatherUsageStats",
        "false",
        "--",
        "--db",
        store_url,
    ]
    server = subprocess.Popen(command, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(port, server, tmp_path / "streamlit.log")
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def wait_until_healthy(port: int, server: subprocess.Popen, log: Path) -> None:
    """Return once the server answers its health check; fail if it exits or never answers."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"streamlit exited with {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.5)
    pytest.fail(f"streamlit did not answer within {SERVER_START_TIMEOUT_S} s:\n{log.read_text()}")


def chromium_command(url: str, profile: Path, *action: str) -> list[str]:
    """Return the headless-Chromium command that renders ``url`` in a fresh ``profile`` and
    then does ``action`` (``--screenshot=PATH`` or ``--dump-dom``)."""
    chromium = shutil.which("chromium")
    assert chromium, "headless Chromium is needed: apt-get install -y chromium"
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        f"--virtual-time-budget={VIRTUAL_TIME_BUDGET_MS}",
        *action,
        url,
    ]


def screenshot(url: str, path: Path, profile: Path) -> Image.Image:
    """Return a headless-Chromium screenshot of ``url`` (also written to ``path``)."""
    command = chromium_command(url, profile, f"--screenshot={path}")
    subprocess.run(command, check=True, capture_output=True, timeout=180)
    return Image.open(path).convert("RGB")


def dumped_dom(url: str, profile: Path) -> str:
    """Return the page's DOM as headless Chromium serialises it once the page has rendered."""
    command = chromium_command(url, profile, "--dump-dom")
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=180)
    return done.stdout


def poll(take: Callable[[int], T], ready: Callable[[T], bool]) -> T:
    """Return ``take(attempt)`` for attempts 0, 1, ... (pausing ``RETRY_PAUSES_S`` between)
    until ``ready`` holds of it or ``SCREENSHOT_DEADLINE_S`` has passed: the last one taken."""
    deadline = time.monotonic() + SCREENSHOT_DEADLINE_S
    attempt = 0
    while True:
        taken = take(attempt)
        if ready(taken) or time.monotonic() > deadline:
            return taken
        time.sleep(RETRY_PAUSES_S[min(attempt, len(RETRY_PAUSES_S) - 1)])
        attempt += 1


def colour_pixels(pixels: np.ndarray, hex_colour: str) -> int:
    """Return how many pixels lie within COLOUR_TOLERANCE of ``hex_colour`` on every channel."""
    target = np.array([int(hex_colour[i : i + 2], 16) for i in (1, 3, 5)])
    return int((np.abs(pixels - target).max(axis=2) <= COLOUR_TOLERANCE).sum())


def coloured_pixels(pixels: np.ndarray) -> int:
    """Return how many pixels are saturated (max − min channel > 60): not white, grey or black."""
    return int((pixels.max(axis=2) - pixels.min(axis=2) > 60).sum())


def trace_colours() -> dict[str, str]:
    """Return the colour each drawn policy's frontier uses (its fixed palette slot)."""
    return {policy: PALETTE[POLICY_ORDER.index(policy)] for policy in DRAWN_POLICIES}


@pytest.mark.slow
def test_pareto_page_draws_the_frontiers_in_chromium(served_app: str, tmp_path: Path) -> None:
    main, path = charts_screenshot(served_app, tmp_path, "pareto")
    # Text and grid lines are grey; only the plotly traces (and their legend) are coloured.
    assert coloured_pixels(main) >= MIN_COLOURED_PIXELS, f"no chart drawn: {path}"
    by_policy = {policy: colour_pixels(main, hex_) for policy, hex_ in trace_colours().items()}
    assert all(count >= MIN_TRACE_PIXELS for count in by_policy.values()), (by_policy, path)
    plot_area = main[:, :-LEGEND_WIDTH, :]  # data markers and lines, legend swatches excluded
    in_plot = sum(colour_pixels(plot_area, hex_) for hex_ in trace_colours().values())
    assert in_plot >= MIN_TRACE_PIXELS, (in_plot, path)


def charts_screenshot(url: str, tmp_path: Path, name: str) -> tuple[np.ndarray, Path]:
    """Return the main area of a screenshot of ``url`` once its charts are drawn (retried until
    ``SCREENSHOT_DEADLINE_S``), and the screenshot's path."""

    def take(attempt: int) -> tuple[np.ndarray, Path]:
        path = tmp_path / f"{name}-{attempt}.png"
        image = screenshot(url, path, tmp_path / f"{name}-profile-{attempt}")
        assert image.size == WINDOW
        return np.asarray(image, dtype=int)[:, MAIN_AREA_LEFT:, :], path

    return poll(take, lambda shot: coloured_pixels(shot[0]) >= MIN_COLOURED_PIXELS)


@pytest.mark.slow
def test_batch_page_draws_the_crossover_in_chromium(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'batches.db'}"
    seed_synthetic_batches(store)
    with serving(store, tmp_path) as url:
        main, path = charts_screenshot(f"{url}batches", tmp_path, "batches")
    assert coloured_pixels(main) >= MIN_COLOURED_PIXELS, f"no chart drawn: {path}"
    static = PALETTE[POLICY_ORDER.index("static")]
    assert colour_pixels(main[:, :-LEGEND_WIDTH, :], static) >= MIN_TRACE_PIXELS, path


@pytest.mark.slow
def test_pareto_legend_names_each_draft_kind_in_chromium(
    served_drafts_app: str, tmp_path: Path
) -> None:
    """A pair with a draft model and a lookup: the rendered Pareto legend names each policy
    once per draft kind."""
    wanted = ("static (lm)", "static (ngram)", "adaedl (ngram)")
    dom = poll(
        lambda attempt: dumped_dom(served_drafts_app, tmp_path / f"profile-{attempt}"),
        lambda page: all(name in page for name in wanted),
    )
    missing = [name for name in wanted if name not in dom]
    assert missing == [], f"not in the rendered page: {missing}"
