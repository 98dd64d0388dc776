"""The Streamlit app under AppTest: every page on seeded stores, and the empty/missing states.

The fast tests use the synthetic store (hand-made engine results recorded through the store
API); the slow one renders every page on a store filled by a real micro-zoo sweep.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tomllib
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest
from support.dashboard_seed import (
    SYNTHETIC_T_DRAFT,
    SYNTHETIC_T_TARGET,
    seed_draft_kinds_sweep,
    seed_real_sweep,
    seed_synthetic_batches,
    seed_synthetic_sweeps,
)
from support.paths import REPO

from dashboard.data import FILL_COMMAND
from orchestrator.store import open_store

APP = REPO / "dashboard" / "app.py"
FRONTIERS, TABLES, ROBUSTNESS, ACCEPTANCE, COST, COMPARE, COMPARE_TRIALS, BATCHES = (
    "views/frontiers.py",
    "views/paper_tables.py",
    "views/robustness.py",
    "views/acceptance.py",
    "views/cost_model.py",
    "views/compare.py",
    "views/compare_trials.py",
    "views/batches.py",
)
PAGES = (FRONTIERS, TABLES, ROBUSTNESS, ACCEPTANCE, COST, COMPARE, COMPARE_TRIALS, BATCHES)


@pytest.fixture(scope="module")
def synthetic_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding the synthetic sweeps (hand-made results, exact cost model)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash-app') / 'results.db'}"
    seed_synthetic_sweeps(url)
    return url


@pytest.fixture(scope="module")
def batches_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding a synthetic sweep measured at batch sizes 1, 4 and 16."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash-batches') / 'results.db'}"
    seed_synthetic_batches(url)
    return url


@pytest.fixture(scope="module")
def real_url(micro_zoo, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store filled by a real sweep, shared with the browser test (run once a session)."""
    url = f"sqlite:///{tmp_path_factory.getbasetemp() / 'dashboard-real.db'}"
    seed_real_sweep(url, micro_zoo.root)
    return url


def open_app(url: str, monkeypatch: pytest.MonkeyPatch, page: str | None = None) -> AppTest:
    """Run the app on the store at ``url`` (via $SPECSWEEP_DB), then on ``page``."""
    monkeypatch.setenv("SPECSWEEP_DB", url)
    app = AppTest.from_file(APP, default_timeout=120).run()
    if page is not None:
        app.switch_page(page).run()
    assert not app.exception, [error.value for error in app.exception]
    return app


def figures(app: AppTest) -> list[dict]:
    """Return the plotly figures on the page as JSON dicts, typed arrays decoded to lists."""
    return [decode(json.loads(chart.proto.spec)) for chart in app.get("plotly_chart")]


def decode(value):
    """Replace plotly's base64 typed arrays ({"dtype", "bdata"}) by plain lists, recursively."""
    if isinstance(value, dict) and {"dtype", "bdata"} <= set(value):
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape", [len(array)])
        if isinstance(shape, str):
            shape = [int(size) for size in shape.split(",")]
        return array.reshape(shape).tolist()
    if isinstance(value, dict):
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


def trace_names(figure: dict) -> list[str]:
    """Return the names of a figure's traces, in drawing order."""
    return [trace.get("name") for trace in figure["data"]]


def digest(url: str) -> str:
    """Return the sha256 of the SQLite file behind ``url``."""
    return hashlib.sha256(Path(url.removeprefix("sqlite:///")).read_bytes()).hexdigest()


def test_frontiers_page_draws_a_frontier_per_policy(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch)
    assert app.sidebar.selectbox[0].value == "synthetic-a"  # the newest sweep
    # 96 planned trials, the 16 svip-0.5 ones recorded as failed by the seed.
    captions = [caption.value for caption in app.sidebar.caption]
    assert "80 done · 0 pending · 0 running · 16 failed" in captions
    speed, rates = figures(app)
    for figure in (speed, rates):
        lines = [t["name"] for t in figure["data"] if t["mode"] == "lines+markers"]
        assert lines == ["adaedl", "static", "svip"]
        assert {"greedy oracle", "AR baseline"} <= set(trace_names(figure))
        for trace in figure["data"]:
            assert len(trace["customdata"]) == len(trace["x"])  # config on hover
    assert [shape["y0"] for shape in speed["layout"]["shapes"]] == [1.0]  # speedup-1 line
    bars = [t for t in speed["data"] if "error_y" in t]  # 95% intervals of the speedup
    assert {t["legendgroup"] for t in bars} == {"adaedl", "static", "svip"}
    for trace in bars:
        assert len(trace["error_y"]["array"]) == len(trace["x"])
        assert all(v is None or v >= 0 for v in trace["error_y"]["array"])
    baseline = next(t for t in rates["data"] if t["name"] == "AR baseline")
    assert (baseline["x"], baseline["y"]) == ([0.0], [1.0])  # discards nothing, verifies all


def test_tables_page_shows_each_paper_table_with_csv(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, TABLES)
    # Best settings (dev/test); AdaEDL at K 2 and K 4, SpecDec++, SVIP, AdaSPEC, trials with
    # intervals; provenance.
    assert len(app.dataframe) == 8
    assert len(app.download_button) == 7
    # stored without decode seconds and without a holdout: end to end, chosen on all prompts
    assert [radio.options for radio in app.radio] == [["end-to-end"]]
    assert any("without decode seconds" in info.value for info in app.info)
    best = app.dataframe[0].value
    assert set(best["best_on"].dropna()) == {"same 2"}
    assert best["decode_speedup"].isna().all() and best["e2e_speedup"].notna().any()
    drafting = best[best["policy"] != "ar"]
    assert (drafting["best_speedup"] > 0).all() and (drafting["best_setting"] != "").all()
    intervals = app.dataframe[6].value
    done = intervals.dropna(subset=["speedup low"])
    assert len(done) > 0
    assert (done["speedup low"] <= done["speedup"]).all()
    assert (done["speedup"] <= done["speedup high"]).all()
    runs = app.dataframe[7].value
    assert runs["sweep"].tolist() == ["synthetic-a"] and runs["torch_threads"].item() >= 1
    adaedl_k2 = app.dataframe[1].value
    assert list(adaedl_k2.columns) == ["policy", "builtin:code", "builtin:math"]
    assert adaedl_k2["policy"].iloc[0] == "ar"
    kd = app.dataframe[5].value
    assert set(kd["method"]) == {"none (base draft)", "adaspec"}
    assert set(kd["draft"]) == {"zoo:micro/draft-s", "kd-adaspec"}
    assert not any("No knowledge-distilled drafts" in info.value for info in app.info)


def test_a_pairs_draft_kinds_are_told_apart_on_the_frontiers_and_in_the_tables(
    tmp_path, monkeypatch
) -> None:
    url = f"sqlite:///{tmp_path / 'drafts.db'}"
    seed_draft_kinds_sweep(url)
    app = open_app(url, monkeypatch)
    for figure in figures(app):
        lines = {t["name"]: t for t in figure["data"] if t["mode"] == "lines+markers"}
        assert set(lines) == {"adaedl (lm)", "adaedl (ngram)", "static (lm)", "static (ngram)"}
        assert lines["static (ngram)"]["marker"]["symbol"] == "diamond"
        kinds = {row[7] for t in figure["data"] for row in t["customdata"]}
        assert {"lm", "ngram"} <= kinds  # the hover names the kind
    app.switch_page(TABLES).run()
    assert not app.exception
    best = app.dataframe[0].value
    assert set(best["draft_kind"]) == {"lm", "ngram"}
    intervals = next(df.value for df in app.dataframe if "draft kind" in df.value.columns)
    assert set(intervals["draft kind"]) == {"lm", "ngram"}


def test_sidebar_filter_narrows_the_tables(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, TABLES)
    dataset = next(m for m in app.sidebar.multiselect if m.label == "Dataset")
    dataset.set_value(["builtin:math"]).run()
    assert not app.exception
    assert list(app.dataframe[2].value.columns) == ["policy", "builtin:math"]


def test_robustness_page(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, ROBUSTNESS)
    temperature, threshold, lengths = figures(app)
    static = next(t for t in temperature["data"] if t["name"] == "static")
    assert static["x"] == [0.0, 1.0]
    assert {t["legendgroup"].split(",")[0] for t in threshold["data"]} == {"adaedl", "svip"}
    assert {annotation["text"] for annotation in lengths["layout"]["annotations"]} == {
        "kind=drafted",
        "kind=accepted",
    }


def test_cost_model_page_shows_the_stored_fits(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, COST)
    fits = app.dataframe[0].value
    # one stored fit per group: 2 pairs × 2 datasets × 2 temperatures
    assert len(fits) == 8 and set(fits["sweep"]) == {"synthetic-a"}
    assert fits["t_draft"].tolist() == pytest.approx([SYNTHETIC_T_DRAFT] * 8)
    assert fits["t_target"].tolist() == pytest.approx([SYNTHETIC_T_TARGET] * 8)
    assert fits["r2_round"].tolist() == pytest.approx([1.0] * 8)
    assert set(fits["projection_fit"]) <= {"round", "run"}
    (figure,) = figures(app)
    assert {t["legendgroup"].split(",")[-1].strip() for t in figure["data"]} == {"round", "run"}
    assert not app.main.multiselect  # no refit controls: the page shows what the runs stored


def test_acceptance_page_plots_positions_and_lengths(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, ACCEPTANCE)
    positions, lengths = figures(app)
    assert {t["name"] for t in positions["data"]} >= {"static", "adaedl", "oracle"}
    oracle = next(t for t in positions["data"] if t["name"] == "oracle")
    assert oracle["y"] == [1.0, 1.0]  # the oracle drafts min(K, 2) tokens, all accepted
    rates = app.dataframe[0].value
    assert ((rates["rate"] >= 0) & (rates["rate"] <= 1)).all()
    assert lengths["data"]


def test_compare_trials_page_gives_a_verdict(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, COMPARE_TRIALS)
    shown = {metric.label: metric.value for metric in app.metric}
    # the synthetic trials were stored without decode seconds: end-to-end only
    assert set(shown) == {
        "end-to-end tokens/s A / B",
        "end-to-end: 95% interval",
        "end-to-end: verdict",
    }
    ids = app.main.selectbox[0].options
    assert len(ids) > 2


def test_compare_page_lines_up_two_sweeps(synthetic_url, monkeypatch) -> None:
    app = open_app(synthetic_url, monkeypatch, COMPARE)
    assert [box.value for box in app.main.selectbox] == ["synthetic-b", "synthetic-a"]
    table = app.dataframe[0].value
    static = table[(table["policy"] == "static") & (table["dataset"] == "builtin:code")]
    # Sweep B ran static once (K 4, T 0); sweep A on 2 pairs × 2 temperatures × 2 lengths.
    assert (static["n A"].item(), static["n B"].item()) == (1, 8)
    delta = static["tokens_per_s B"].item() - static["tokens_per_s A"].item()
    assert static["tokens_per_s Δ"].item() == pytest.approx(delta, abs=1e-3)
    assert len(app.download_button) == 1 and len(figures(app)) == 1


def test_batch_page_plots_the_crossover_and_the_frontier(batches_url, monkeypatch) -> None:
    app = open_app(batches_url, monkeypatch, BATCHES)
    crossover, frontier = figures(app)
    (static,) = [t for t in crossover["data"] if t["name"] == "static, micro"]  # policy, pair
    assert static["x"] == [1, 4, 16]
    assert static["y"][0] > 1.0 > static["y"][-1]  # speculation stops paying as B grows
    assert [shape["y0"] for shape in crossover["layout"]["shapes"]] == [1.0]
    assert crossover["layout"]["xaxis"]["type"] == "log"
    assert {t["name"] for t in frontier["data"]} == {"ar", "static"}
    ar = [t for t in frontier["data"] if t["name"] == "ar"]
    assert sorted(x for t in ar for x in t["text"]) == [1, 4, 16]


def test_batch_page_says_how_to_measure_batches_on_a_batch_one_sweep(
    synthetic_url, monkeypatch
) -> None:
    app = open_app(synthetic_url, monkeypatch, BATCHES)
    assert "batch_sizes" in app.info[0].value
    assert not figures(app)


def test_pages_never_write_to_the_store(synthetic_url, monkeypatch) -> None:
    before = digest(synthetic_url)
    app = open_app(synthetic_url, monkeypatch)
    for page in PAGES:
        app.switch_page(page).run()
        assert not app.exception, (page, [error.value for error in app.exception])
    assert digest(synthetic_url) == before


def test_empty_store_says_how_to_fill_it(tmp_path, monkeypatch) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_store(url).close()  # a migrated store with no trials
    for page in (None, TABLES):
        app = open_app(url, monkeypatch, page)
        [info] = app.info
        assert url in info.value and FILL_COMMAND in info.value
        assert not app.get("plotly_chart") and not app.dataframe


def test_missing_store_warns_and_creates_nothing(tmp_path, monkeypatch) -> None:
    path = tmp_path / "missing.db"
    app = open_app(f"sqlite:///{path}", monkeypatch)
    [warning] = app.warning
    assert str(path) in warning.value and FILL_COMMAND in warning.value
    assert not path.exists()


def test_server_config_binds_to_localhost() -> None:
    # Streamlit reads .streamlit/config.toml beside the main script (after ~/ and $CWD/).
    config = tomllib.loads((APP.parent / ".streamlit" / "config.toml").read_text())
    assert config["server"] == {"address": "127.0.0.1", "headless": True}


def test_unusable_url_warns(monkeypatch) -> None:
    app = open_app("nosuchdialect://host/db", monkeypatch)
    [warning] = app.warning
    assert "nosuchdialect://host/db" in warning.value


@pytest.mark.slow
@pytest.mark.ray
def test_every_page_renders_on_a_real_sweep(real_url, monkeypatch) -> None:
    app = open_app(real_url, monkeypatch)
    assert app.sidebar.selectbox[0].value == "dashboard-real"  # the newest sweep
    for figure in figures(app):
        lines = [t["name"] for t in figure["data"] if t["mode"] == "lines+markers"]
        assert lines == ["adaedl", "static", "svip"]
        assert {"greedy oracle", "AR baseline"} <= set(trace_names(figure))

    app.switch_page(TABLES).run()
    assert not app.exception
    # best settings, K 2, K 4, 4 more; a live sweep: decode-only first, and the best by it
    assert len(app.dataframe) == 8 and len(app.download_button) == 7
    assert [radio.options for radio in app.radio] == [["decode-only", "end-to-end"]]
    best = app.dataframe[0].value
    assert best["decode_speedup"].notna().all()
    assert set(best["best_note"].dropna()) == {
        f"best chosen and measured on the same {n} prompts (decode-only)"
        for n in set(best["best_on"].dropna().str.removeprefix("same ").astype(int))
    }
    assert any("No knowledge-distilled drafts" in info.value for info in app.info)

    app.switch_page(ROBUSTNESS).run()
    assert not app.exception and len(figures(app)) == 3

    app.switch_page(COST).run()
    assert not app.exception
    stored = app.dataframe[0].value  # one group per temperature
    assert len(stored) == 2 and (stored["t_target"] > 0).all()
    assert set(stored["projection_fit"]) <= {"round", "run"}

    app.switch_page(ACCEPTANCE).run()
    assert not app.exception and len(figures(app)) == 2

    app.switch_page(COMPARE).run()
    assert not app.exception
    assert [box.value for box in app.main.selectbox] == ["dashboard-real-greedy", "dashboard-real"]
    table = app.dataframe[0].value
    assert set(table["policy"]) == {"ar", "static", "adaedl", "svip", "oracle"}
    greedy_static = table[table["policy"] == "static"]
    # Sweep A holds the greedy trials only: 2 static trials (K 2, 4) against 4 in sweep B.
    assert (greedy_static["n A"].item(), greedy_static["n B"].item()) == (2, 4)


def test_every_page_renders_the_committed_gpu_sweep(tmp_path, monkeypatch) -> None:
    """The fifth GPU run's DeepSpeed sweep (an H200, bfloat16, NCCL): the pages render it and
    the provenance table names the GPU it ran on."""
    store = tmp_path / "gpu.db"
    shutil.copyfile(REPO / "docs" / "gpu" / "gpu-ds-h200-run5.db", store)
    app = open_app(f"sqlite:///{store}", monkeypatch)
    points = [t for figure in figures(app) for t in figure["data"]]
    assert {"static", "adaedl"} <= {t["name"] for t in points}
    for page in PAGES[1:]:
        app.switch_page(page).run()
        assert not app.exception, (page, [error.value for error in app.exception])
        if page == TABLES:
            runs = app.dataframe[-1].value
            assert list(runs["gpu_name"]) == ["NVIDIA H200"]
            assert list(runs["gpu_count"]) == [1]
