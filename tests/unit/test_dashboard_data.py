"""Dashboard data functions, paper tables and the cost-model fit on hand-made rows.

Every expected number below is worked out by hand from the rows in this file (the comments
show the arithmetic); the store-backed tests check the loaders against the synthetic seed,
whose rounds follow a known cost model.
"""

from __future__ import annotations

import hashlib
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from support.dashboard_seed import (
    SYNTHETIC_FAILED,
    SYNTHETIC_T_DRAFT,
    SYNTHETIC_T_TARGET,
    seed_synthetic_sweeps,
)

from dashboard import acceptance, charts, data, fits, tables, trial_compare
from orchestrator.analysis.costs.model import CostModelError, fit_cost_model, r_squared
from orchestrator.analysis.holdout import PromptSplit, SweepSamples
from orchestrator.analysis.pairing import SampleSpeed

NAN = math.nan
#: (trial_id, pair, dataset, temperature, policy, threshold, K, tokens/s, speedup,
#:  mean_drafted, discard_rate, verification_rate, n_drafted, n_accepted, draft_job)
ROWS = [
    ("b1", "p", "code", 0.0, "ar", NAN, 0, 10.0, 1.0, 0.0, 0.0, 1.0, 0, 0, None),
    ("b2", "p", "math", 0.0, "ar", NAN, 0, 20.0, 1.0, 0.0, 0.0, 1.0, 0, 0, None),
    ("s1", "p", "code", 0.0, "static", NAN, 2, 15.0, 1.5, 2.0, 0.2, 0.5, 20, 10, None),
    ("s2", "p", "code", 0.0, "static", NAN, 4, 18.0, 1.8, 4.0, 0.5, 0.4, 40, 20, None),
    ("s3", "p", "math", 0.0, "static", NAN, 4, 30.0, 1.5, 4.0, 0.4, 0.4, 40, 24, None),
    ("a1", "p", "code", 0.0, "adaedl", 0.3, 4, 16.0, 1.6, 3.0, 0.3, 0.45, 30, 21, None),
    ("a2", "p", "code", 1.0, "adaedl", 0.3, 4, 12.0, 1.2, 3.4, 0.35, 0.5, 34, 17, None),
    ("a3", "p", "code", 0.0, "adaedl", 0.6, 4, 17.0, 1.7, 2.5, 0.1, 0.42, 25, 20, None),
    ("a4", "p", "math", 0.0, "adaedl", 0.6, 4, 36.0, 1.8, 2.5, 0.15, 0.4, 25, 18, None),
    ("o1", "p", "code", 0.0, "oracle", NAN, 4, 25.0, 2.5, 2.0, 0.0, 0.33, 20, 20, None),
    ("k1", "p-kd", "code", 0.0, "static", NAN, 4, 20.0, 2.0, 4.0, 0.3, 0.35, 40, 30, "kd1"),
]


def make_trials(rows=ROWS) -> pd.DataFrame:
    """Return a trials frame shaped like data.load_trials' output from ``rows``."""
    records = []
    for (
        trial_id,
        pair,
        dataset,
        temperature,
        policy,
        threshold,
        max_draft_len,
        tokens_per_s,
        speedup,
        mean_drafted,
        discard_rate,
        verification_rate,
        n_drafted,
        n_accepted,
        draft_job,
    ) in rows:
        record = {column: None for column in data.TRIAL_COLUMNS}
        record.update(
            trial_id=trial_id,
            pair=pair,
            dataset=dataset,
            temperature=temperature,
            policy=policy,
            threshold=threshold,
            max_draft_len=max_draft_len,
            is_baseline=policy == "ar",
            status="done",
            tokens_per_s=tokens_per_s,
            speedup=speedup,
            acceptance_rate=n_accepted / n_drafted if n_drafted else NAN,
            mean_drafted=mean_drafted,
            discard_rate=discard_rate,
            verification_rate=verification_rate,
            mean_accepted=NAN,
            n_drafted=n_drafted,
            n_accepted=n_accepted,
            draft=None if draft_job else "d-model",
            draft_job=draft_job,
            batch_size=1,
            draft_kind="lm",
        )
        records.append(record)
    return pd.DataFrame(records, columns=list(data.TRIAL_COLUMNS))


def ids(frame: pd.DataFrame) -> list[str]:
    """Return the frame's trial ids, sorted."""
    return sorted(frame["trial_id"])


def row(table: pd.DataFrame, **where) -> pd.Series:
    """Return the single row of ``table`` matching every column=value in ``where``."""
    mask = np.logical_and.reduce([table[column] == value for column, value in where.items()])
    matched = table[mask]
    assert len(matched) == 1, f"{where} matched {len(matched)} rows"
    return matched.iloc[0]


# --- filters -------------------------------------------------------------------------------


def test_filter_options_leave_out_the_baselines_max_length() -> None:
    assert data.filter_options(make_trials()) == {
        "pairs": ["p", "p-kd"],
        "datasets": ["code", "math"],
        "temperatures": [0.0, 1.0],
        "max_draft_lens": [2, 4],
        "batch_sizes": [1],
    }


def test_filters_keep_baselines_under_the_length_filter() -> None:
    trials = make_trials()
    assert ids(data.apply_filters(trials, data.TrialFilters(max_draft_lens=(2,)))) == [
        "b1",
        "b2",
        "s1",
    ]
    assert ids(data.apply_filters(trials, data.TrialFilters(datasets=("math",)))) == [
        "a4",
        "b2",
        "s3",
    ]
    assert ids(data.apply_filters(trials, data.TrialFilters(temperatures=(1.0,)))) == ["a2"]
    assert ids(data.apply_filters(trials, data.TrialFilters(pairs=("p-kd",)))) == ["k1"]
    assert len(data.apply_filters(trials, data.TrialFilters())) == len(ROWS)


def test_done_trials_drop_other_statuses() -> None:
    trials = make_trials()
    trials.loc[trials["trial_id"] == "a2", "status"] = "failed"
    trials.loc[trials["trial_id"] == "o1", "status"] = "pending"
    assert "a2" not in ids(data.done_trials(trials))
    assert len(data.done_trials(trials)) == len(ROWS) - 2


# --- aggregates ------------------------------------------------------------------------------


def test_best_settings_average_then_take_the_best() -> None:
    best = data.best_settings(make_trials(), ["policy", "dataset"], "tokens_per_s")
    # adaedl/code: threshold 0.3 → (16 + 12) / 2 = 14; threshold 0.6 → 17. Best: 0.6.
    adaedl = row(best, policy="adaedl", dataset="code")
    assert adaedl["threshold"] == 0.6 and adaedl["tokens_per_s"] == 17.0
    # static/code: K 2 → 15; K 4 → (s2 18 + k1 20) / 2 = 19. Best: K 4 from 2 trials.
    static = row(best, policy="static", dataset="code")
    assert static["max_draft_len"] == 4 and static["tokens_per_s"] == 19.0
    assert static["n_trials"] == 2


def test_config_points_average_each_setting() -> None:
    points = data.config_points(make_trials())
    adaedl = row(points, policy="adaedl", threshold=0.3)
    assert adaedl["tokens_per_s"] == pytest.approx(14.0)  # (16 + 12) / 2
    assert adaedl["mean_drafted"] == pytest.approx(3.2)  # (3.0 + 3.4) / 2
    assert adaedl["n_trials"] == 2
    static = row(points, policy="static", max_draft_len=4)
    assert static["tokens_per_s"] == pytest.approx(68 / 3)  # (18 + 30 + 20) / 3
    assert static["speedup"] == pytest.approx(5.3 / 3)  # (1.8 + 1.5 + 2.0) / 3
    baseline = points[points["is_baseline"]]
    assert len(baseline) == 1 and baseline["tokens_per_s"].iloc[0] == 15.0  # (10 + 20) / 2


def test_frontiers_are_per_policy() -> None:
    points = data.config_points(make_trials())
    marked = data.mark_frontiers(points, "mean_drafted", "speedup", False, True)
    # adaedl 0.6: (2.5 drafted, 1.75 speedup) beats 0.3: (3.2, 1.4).
    assert row(marked, policy="adaedl", threshold=0.6)["on_front"]
    assert not row(marked, policy="adaedl", threshold=0.3)["on_front"]
    # static K2 (2, 1.5) and K4 (4, 1.767) trade off; the oracle is alone in its policy.
    assert marked[marked["policy"] == "static"]["on_front"].all()
    assert row(marked, policy="oracle")["on_front"]
    rates = data.mark_frontiers(points, "discard_rate", "verification_rate", False, False)
    # adaedl 0.6: (0.125, 0.41) beats 0.3: (0.325, 0.475) on both, lower being better.
    assert row(rates, policy="adaedl", threshold=0.6)["on_front"]
    assert not row(rates, policy="adaedl", threshold=0.3)["on_front"]


def test_speedup_vs_temperature_takes_each_temperatures_best_setting() -> None:
    table = data.speedup_vs_temperature(make_trials())
    assert "ar" not in set(table["policy"])
    hot = row(table, policy="adaedl", temperature=1.0)
    assert hot["speedup"] == pytest.approx(1.2) and hot["threshold"] == 0.3
    cold = row(table, policy="adaedl", temperature=0.0)
    assert cold["speedup"] == pytest.approx(1.75) and cold["threshold"] == 0.6  # (1.7 + 1.8) / 2
    assert row(table, policy="static", temperature=0.0)["max_draft_len"] == 4  # 1.767 > 1.5


def test_throughput_vs_threshold_only_threshold_policies() -> None:
    table = data.throughput_vs_threshold(make_trials())
    assert set(table["policy"]) == {"adaedl"}
    assert list(table["threshold"]) == [0.3, 0.6]
    assert list(table["tokens_per_s"]) == pytest.approx([14.0, 26.5])  # (17 + 36) / 2


def test_round_length_distribution() -> None:
    counts = pd.DataFrame(
        [
            ("s1", 4, 2, 3),
            ("s1", 4, 4, 1),
            ("a1", 2, 1, 2),
            ("b1", 0, 0, 10),
        ],
        columns=["trial_id", "drafted", "accepted", "rounds"],
    )
    dist = data.round_length_distribution(counts, make_trials())
    assert "ar" not in set(dist["policy"])
    assert row(dist, policy="static", kind="drafted", length=4)["rounds"] == 4
    assert row(dist, policy="static", kind="drafted", length=4)["fraction"] == 1.0
    assert row(dist, policy="static", kind="accepted", length=2)["fraction"] == 0.75
    assert row(dist, policy="static", kind="accepted", length=4)["fraction"] == 0.25
    assert row(dist, policy="adaedl", kind="accepted", length=1)["rounds"] == 2


def test_compare_sweeps_lines_up_cells() -> None:
    side_a = make_trials(
        [
            ("x1", "p", "code", 0.0, "static", NAN, 4, 10.0, 1, 4, 0, 0, 1, 1, None),
            ("x2", "p", "code", 0.0, "static", NAN, 2, 14.0, 1, 4, 0, 0, 1, 1, None),
            ("x3", "p", "code", 0.0, "adaedl", 0.3, 4, 20.0, 1, 4, 0, 0, 1, 1, None),
        ]
    )
    side_b = make_trials(
        [
            ("y1", "p", "code", 0.0, "static", NAN, 4, 15.0, 1, 4, 0, 0, 1, 1, None),
            ("y2", "p", "code", 0.0, "oracle", NAN, 4, 30.0, 1, 4, 0, 0, 1, 1, None),
        ]
    )
    table = data.compare_sweeps(side_a, side_b, ["tokens_per_s"])
    static = row(table, policy="static")
    assert (static["n A"], static["n B"]) == (2, 1)
    assert static["tokens_per_s A"] == 12.0  # (10 + 14) / 2
    assert static["tokens_per_s Δ"] == 3.0  # 15 − 12
    oracle = row(table, policy="oracle")
    assert oracle["n A"] == 0 and math.isnan(oracle["tokens_per_s A"])
    assert math.isnan(oracle["tokens_per_s Δ"])
    assert row(table, policy="adaedl")["tokens_per_s A"] == 20.0


# --- cost model ------------------------------------------------------------------------------


def test_cost_fit_recovers_known_costs_exactly() -> None:
    n_draft = np.array([0, 1, 2, 3, 4, 5, 7])
    n_target = np.array([1, 1, 1, 2, 2, 3, 2])
    seconds = 0.0234 * n_draft + 0.112 * n_target  # SpecDec++'s A100 profile
    fit = fit_cost_model(n_draft, n_target, seconds)
    assert fit.t_draft == pytest.approx(0.0234, abs=1e-12)
    assert fit.t_target == pytest.approx(0.112, abs=1e-12)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)
    assert fit.n_observations == 7
    assert fit.predict([10], [3]).tolist() == pytest.approx([0.234 + 0.336])


def test_cost_fit_r2_by_hand() -> None:
    # XᵀX = [[2, 1], [1, 2]], Xᵀy = [4, 4] → t_draft = t_target = 4/3; predictions
    # [4/3, 4/3, 8/3], residuals [−1/3, −1/3, 1/3]: SS_res = 1/3; mean 5/3: SS_tot = 8/3.
    fit = fit_cost_model([1, 0, 1], [0, 1, 1], [1.0, 1.0, 3.0])
    assert fit.t_draft == pytest.approx(4 / 3)
    assert fit.t_target == pytest.approx(4 / 3)
    assert fit.r2 == pytest.approx(1 - (1 / 3) / (8 / 3))


def test_cost_fit_refuses_what_the_data_cannot_tell() -> None:
    with pytest.raises(CostModelError, match="proportional"):
        fit_cost_model([4, 8, 12], [1, 2, 3], [1.0, 2.0, 3.0])
    with pytest.raises(CostModelError, match="at least 2"):
        fit_cost_model([1], [1], [1.0])
    with pytest.raises(CostModelError, match="equal length"):
        fit_cost_model([1, 2], [1, 1], [1.0])
    with pytest.raises(CostModelError, match="finite"):
        fit_cost_model([1, 2], [1, 1], [1.0, math.nan])


def test_r_squared_of_constant_measurements() -> None:
    assert r_squared([2.0, 2.0], [0.0, 0.0]) == 1.0
    assert r_squared([2.0, 2.0], [0.5, 0.0]) == 0.0


def test_fit_totals_predict_trials_with_both_stored_fits() -> None:
    trials = make_trials().assign(
        seconds=1.0, n_rounds=10, n_samples=2, generated_tokens=20, samples=2, max_new_tokens=16
    )
    trials["n_draft_forwards"] = trials["n_drafted"]
    trials["mode"] = ["replay" if t == "a1" else "live" for t in trials["trial_id"]]
    trials["fit_group"] = [
        f"{row.pair}/{row.dataset}/{row.temperature}" for row in trials.itertuples(index=False)
    ]
    group = {"pair": "p", "dataset": "code", "split": None, "samples": 2, "max_new_tokens": 16}
    lookup = {**group, "temperature": 0.0, "t_draft": 0.0, "t_target": 9.0, "t_per_verified": 0}
    batch_fit = {**lookup, "group_key": "p/code/1.0", "step_model": {"kind": "batch"}}
    batch_fit["step_model"]["batch_size"] = 4
    stored = pd.DataFrame(
        [
            # Same pair, dataset and temperature, another group (a lookup draft's): not used.
            {**lookup, "group_key": "p/code/0.0/ngram", "step_model": None},
            batch_fit,
            {
                "group_key": "p/code/0.0",
                "step_model": None,
                "pair": "p",
                "dataset": "code",
                "split": None,
                "samples": 2,
                "max_new_tokens": 16,
                "temperature": 0.0,
                "t_draft": 0.01,
                "t_target": 0.05,
                "t_per_verified": 0.0,
                "r2_draft": 1.0,
                "r2_verify": 1.0,
                "r2_round": 1.0,
                "n_rounds": 10,
                "overhead_seconds": 0.0,
                "run_t_draft": 0.02,
                "run_t_target": 0.1,
            },
        ]
    )
    totals = fits.fit_totals(stored, trials)
    # live trials of pair p, dataset code, temperature 0 (a1 is replayed): b1, s1, s2, a3, o1;
    # the batch table of a2's group p/code/1.0 prices no trial's counts
    assert set(totals["trial_id"]) == {"b1", "s1", "s2", "a3", "o1"}
    assert set(totals["fit"]) == {"round", "run"}
    s1 = trials[trials["trial_id"] == "s1"].iloc[0]
    forwards, rounds = s1["n_draft_forwards"], s1["n_rounds"]
    by_fit = totals[totals["trial_id"] == "s1"].set_index("fit")["predicted_s"]
    assert by_fit["round"] == pytest.approx(0.01 * forwards + 0.05 * rounds)
    assert by_fit["run"] == pytest.approx(0.02 * forwards + 0.1 * rounds)


def test_position_rates_pool_counts_per_policy() -> None:
    trials = make_trials()
    positions = pd.DataFrame(
        [
            ("s1", 1, 10, 8, 0.8),
            ("s1", 2, 10, 4, 0.4),
            ("s2", 1, 30, 15, 0.5),  # static pools s1 and s2: (8 + 15) / (10 + 30)
            ("a1", 1, 5, 5, 1.0),
            ("b1", 1, 0, 0, 0.0),  # a baseline row is ignored
        ],
        columns=["trial_id", "position", "drafted", "accepted", "rate"],
    )
    rates = acceptance.position_rates(positions, trials)
    static = rates[rates["policy"] == "static"].set_index("position")["rate"]
    assert static[1] == pytest.approx(23 / 40) and static[2] == pytest.approx(0.4)
    assert set(rates["policy"]) == {"static", "adaedl"}
    lengths = pd.DataFrame(
        [("s1", 0, 2), ("s1", 1, 6), ("s2", 1, 2)], columns=["trial_id", "length", "rounds"]
    )
    shares = acceptance.accepted_length_shares(lengths, trials).set_index("length")
    assert shares.loc[0, "fraction"] == pytest.approx(0.2)
    assert shares.loc[1, "fraction"] == pytest.approx(0.8)


def test_config_points_carry_intervals_pooled_over_their_trials() -> None:
    trials = make_trials()
    trials["speedup_low"] = trials["speedup"] - 0.1
    trials["speedup_high"] = trials["speedup"] + 0.2
    points = data.config_points(trials).set_index(["policy", "max_draft_len"])
    oracle = points.xs("oracle", level="policy")  # one trial: its own bounds
    assert oracle["n_trials"].item() == 1
    assert oracle["speedup_low"].item() == pytest.approx(2.4)
    assert oracle["speedup_high"].item() == pytest.approx(2.7)
    # adaedl 0.6 at K 4: a3 (1.7) and a4 (1.8), half-widths 0.15 each:
    # mean 1.75 ± √(0.15² + 0.15²) / 2
    pooled = points[points["threshold"] == 0.6].xs("adaedl", level="policy")
    assert pooled["n_trials"].item() == 2
    half = math.sqrt(2 * 0.15**2) / 2
    assert pooled["speedup_low"].item() == pytest.approx(1.75 - half)
    assert pooled["speedup_high"].item() == pytest.approx(1.75 + half)
    trials.loc[trials["trial_id"] == "a4", "speedup_low"] = NAN  # one trial without: none
    points = data.config_points(trials)
    missing = points[(points["policy"] == "adaedl") & (points["threshold"] == 0.6)]
    assert math.isnan(missing["speedup_low"].item())


def test_trial_interval_table_orders_by_speedup() -> None:
    trials = make_trials()
    for figure in data.INTERVAL_FIGURES:
        trials[f"{figure}_low"] = trials[figure] * 0.9
        trials[f"{figure}_high"] = trials[figure] * 1.1
    table = tables.trial_interval_table(trials)
    assert table["speedup"].iloc[0] == 2.5 and table["policy"].iloc[0] == "oracle"
    assert table["speedup low"].iloc[0] == pytest.approx(2.25)
    assert len(table) == len(trials)


# --- tables ----------------------------------------------------------------------------------


def test_adaedl_tables_per_max_draft_length() -> None:
    by_length = tables.tokens_per_s_tables(make_trials())
    assert sorted(by_length) == [2, 4]
    short = by_length[2]
    assert list(short["policy"]) == ["ar", "static"]
    assert row(short, policy="ar")["math"] == 20.0
    assert row(short, policy="static")["code"] == 15.0
    assert math.isnan(row(short, policy="static")["math"])
    long = by_length[4]
    assert list(long["policy"]) == ["ar", "adaedl", "oracle", "static"]
    assert row(long, policy="adaedl")["code"] == 17.0  # best of 14 (0.3) and 17 (0.6)
    assert row(long, policy="static")["code"] == 19.0  # (18 + 20) / 2


def test_specdecpp_best_throughput_table() -> None:
    table = tables.best_throughput_table(make_trials())
    assert row(table, policy="static")["code"] == 19.0  # K 4 (19) beats K 2 (15)
    assert row(table, policy="static")["math"] == 30.0
    assert row(table, policy="adaedl")["math"] == 36.0
    assert row(table, policy="ar")["code"] == 10.0


def test_svip_table_uses_one_setting_per_policy() -> None:
    table = tables.speedup_by_domain_table(make_trials())
    assert "ar" not in set(table["policy"])
    adaedl = row(table, policy="adaedl")
    # threshold 0.6: (1.7 + 1.8) / 2 = 1.75 beats threshold 0.3: 1.4 (code only).
    assert adaedl["setting"] == "threshold 0.6, K 4"
    assert (adaedl["code"], adaedl["math"], adaedl["mean"]) == pytest.approx((1.7, 1.8, 1.75))
    static = row(table, policy="static")
    # K 4: code (1.8 + 2.0) / 2 = 1.9, math 1.5, mean 1.7 beats K 2: 1.5.
    assert static["setting"] == "K 4"
    assert (static["code"], static["math"], static["mean"]) == pytest.approx((1.9, 1.5, 1.7))


def test_adaspec_table_groups_drafts_by_method() -> None:
    trials = make_trials()
    assert tables.has_kd_drafts(trials)
    table = tables.kd_acceptance_table(trials, {"kd1": "adaspec"}, policy="static")
    assert list(table["method"]) == [tables.BASE_DRAFT_METHOD, "adaspec"]
    assert list(table["draft"]) == ["d-model", "kd1"]
    base = row(table, draft="d-model")
    assert base["code"] == pytest.approx(30 / 60)  # (10 + 20) / (20 + 40)
    assert base["math"] == pytest.approx(24 / 40)
    assert row(table, draft="kd1")["code"] == pytest.approx(30 / 40)
    pooled = tables.kd_acceptance_table(trials, {"kd1": "adaspec"})
    # All drafting trials of d-model on code: (10+20+21+17+20+20) / (20+40+30+34+25+20).
    assert row(pooled, draft="d-model")["code"] == pytest.approx(108 / 169)
    assert not tables.has_kd_drafts(trials[trials["trial_id"] != "k1"])


def test_table_csv_round_trips() -> None:
    table = tables.best_throughput_table(make_trials())
    parsed = pd.read_csv(io.BytesIO(tables.table_csv(table)))
    assert list(parsed.columns) == ["policy", "code", "math"]
    assert parsed.loc[parsed["policy"] == "static", "code"].item() == 19.0


def test_setting_labels() -> None:
    assert tables.setting_label(NAN, 4) == "K 4"
    assert tables.setting_label(None, 2) == "K 2"
    assert tables.setting_label(0.3, 16) == "threshold 0.3, K 16"


# --- loading through the store ---------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store holding the synthetic sweeps (hand-made results, exact cost model)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash-data') / 'results.db'}"
    seed_synthetic_sweeps(url)
    return url


def _digest(url: str) -> str:
    """Return the sha256 of the SQLite file behind ``url``."""
    return hashlib.sha256(Path(url.removeprefix("sqlite:///")).read_bytes()).hexdigest()


def test_loaders_read_the_store_without_writing(synthetic_url: str) -> None:
    before = _digest(synthetic_url)
    assert data.load_sweep_names(synthetic_url) == ["synthetic-b", "synthetic-a"]
    trials = data.load_trials(synthetic_url, "synthetic-a")
    # 2 pairs × 2 datasets × (12 trials + AR at T=0, 10 + AR at T=1) = 96, of which the
    # svip 0.5 trials (2 pairs × 2 datasets × 2 temperatures × 2 lengths = 16) failed.
    assert len(trials) == 96
    assert (trials["status"] == "failed").sum() == 16
    failed = trials[trials["status"] == "failed"]
    assert set(zip(failed["policy"], failed["threshold"], strict=True)) == {SYNTHETIC_FAILED}
    assert len(data.load_trials(synthetic_url)) == 96 + 3
    assert data.load_draft_job_kinds(synthetic_url) == {"kd-adaspec": "adaspec"}
    done = data.done_trials(trials)
    stored = fits.load_cost_fits(synthetic_url, "synthetic-a")
    assert stored["t_draft"].tolist() == pytest.approx([SYNTHETIC_T_DRAFT] * len(stored))
    assert stored["t_target"].tolist() == pytest.approx([SYNTHETIC_T_TARGET] * len(stored))
    assert set(stored["projection_fit"]) <= {"round", "run"}
    counts = data.load_round_counts(synthetic_url, list(done["trial_id"]))
    drafting = done[~done["is_baseline"]]
    positions = acceptance.load_position_acceptance(synthetic_url, list(drafting["trial_id"]))
    first = positions[positions["position"] == 1]
    drafted_rounds = counts[counts["drafted"] >= 1]
    assert first["drafted"].sum() == drafted_rounds["rounds"].sum()
    runs = trial_compare.load_runs(synthetic_url, done["run_id"])
    assert len(runs) == 1 and runs["sweep"].item() == "synthetic-a"
    assert _digest(synthetic_url) == before


def test_unreadable_stores_raise_store_unavailable(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here.db"
    with pytest.raises(data.StoreUnavailable, match="no store"):
        data.load_trials(f"sqlite:///{missing}")
    assert not missing.exists()
    with pytest.raises(data.StoreUnavailable):
        data.load_sweep_names("nosuchdialect://host/db")


def test_urls_for_messages() -> None:
    shown = data.display_url("postgresql://alice:secret@db.example/specsweep")
    assert "secret" not in shown and "alice" in shown
    assert data.fill_hint(data.default_url()) == data.FILL_COMMAND
    assert data.fill_hint("sqlite:///other.db").endswith("--db sqlite:///other.db")
    assert data.db_argument(["--db", "sqlite:///a.db"]) == "sqlite:///a.db"
    assert data.db_argument(["--x", "1", "--db=sqlite:///b.db"]) == "sqlite:///b.db"
    assert data.db_argument(["--db"]) is None
    assert data.db_argument([]) is None


# --- decode-only and end-to-end; best settings chosen on dev, measured on test ---------------


def _held_out_trials() -> tuple[pd.DataFrame, SweepSamples]:
    """AR and two AdaEDL thresholds on 4 prompts of ``code``: 0.3 is the faster on dev
    prompts 0-1 (decode-only), 0.6 on test prompts 2-3."""
    rows = [r for r in ROWS if r[0] in ("b1", "a1", "a3")]
    trials = make_trials(rows).assign(
        samples=4,
        max_new_tokens=8,
        baseline_id=lambda frame: ["b1" if p != "ar" else None for p in frame["policy"]],
        decode_tokens_per_s=[12.5, 20.0, 21.0],
        decode_speedup=[1.0, 1.6, 1.7],
    )

    def speeds(decode: list[float]) -> list[SampleSpeed]:
        return [SampleSpeed(f"p{i}", i, 10, d + 0.2, d) for i, d in enumerate(decode)]

    samples = {
        "b1": speeds([0.8] * 4),
        "a1": speeds([0.4, 0.4, 0.8, 0.8]),
        "a3": speeds([0.8, 0.8, 0.3, 0.3]),
    }
    split = PromptSplit(dev=(0, 1), test=(2, 3))
    return trials, SweepSamples(samples, {("code", None, 4, 8): split})


def test_best_setting_table_chooses_on_dev_and_measures_on_test() -> None:
    trials, measured = _held_out_trials()
    table = data.best_setting_table(trials, measured)
    adaedl = row(table, policy="adaedl")
    assert adaedl["best_trial"] == "a1" and adaedl["best_setting"].startswith("K 4")
    assert adaedl["best_speedup"] == pytest.approx(1.0)  # a1 on prompts 2-3: 0.8 s as AR
    assert adaedl["best_on"] == "dev 2, test 2"
    assert (
        adaedl["best_note"] == "chosen on 2 dev prompts, measured on 2 test prompts (decode-only)"
    )
    assert adaedl["decode_speedup"] == pytest.approx((1.6 + 1.7) / 2)
    assert adaedl["e2e_speedup"] == pytest.approx((1.6 + 1.7) / 2)
    no_split = data.best_setting_table(trials, SweepSamples(measured.samples, {}))
    same = row(no_split, policy="adaedl")
    assert same["best_trial"] == "a3" and same["best_on"] == "same 4"


def test_speeds_offer_decode_only_first_when_every_done_trial_has_it() -> None:
    trials, _ = _held_out_trials()
    assert data.speeds(trials) == [data.DECODE_ONLY, data.END_TO_END]
    older = trials.assign(decode_tokens_per_s=[12.5, NAN, 21.0])
    assert data.speeds(older) == [data.END_TO_END]
    table = tables.best_throughput_table(trials, data.DECODE_ONLY)
    assert row(table, policy="adaedl")["code"] == 21.0
    assert row(table, policy="ar")["code"] == 12.5
    assert row(tables.best_throughput_table(trials), policy="adaedl")["code"] == 17.0


def test_load_sweep_samples_reads_samples_and_no_split_without_holdout(synthetic_url) -> None:
    trials = data.load_trials(synthetic_url, "synthetic-a")
    done = data.done_trials(trials)
    measured = data.load_sweep_samples(synthetic_url, ("synthetic-a",), tuple(done["trial_id"]))
    assert set(measured.samples) == set(done["trial_id"]) and measured.splits == {}
    assert all(len(samples) == 2 for samples in measured.samples.values())
    table = data.best_setting_table(trials, measured)
    assert set(table["best_on"].dropna()) == {"same 2"}


def test_paper_tables_keep_each_draft_kind_in_its_own_row() -> None:
    """A lookup draft faster than every lm setting must not become the static row's best: with
    two kinds each row is one policy with one kind; the AR row is unchanged."""
    trials = make_trials()
    lookup = trials[trials["policy"] == "static"].assign(
        draft_kind="ngram",
        trial_id=lambda f: f["trial_id"] + "-ngram",
        tokens_per_s=99.0,
        speedup=9.0,
    )
    both = pd.concat([trials, lookup], ignore_index=True)
    best = tables.best_throughput_table(both)
    assert row(best, policy="static (lm)")["code"] == 19.0  # as with the lm draft alone
    assert row(best, policy="static (ngram)")["code"] == 99.0
    assert row(best, policy="ar")["code"] == 10.0
    assert "static" not in set(best["policy"])
    by_domain = tables.speedup_by_domain_table(both)
    assert row(by_domain, policy="static (lm)")["mean"] == pytest.approx(1.7)
    by_length = tables.tokens_per_s_tables(both)
    assert {"adaedl (lm)", "static (lm)", "static (ngram)"} <= set(by_length[4]["policy"])


def test_frontiers_are_per_policy_and_draft_kind_and_labelled_by_kind() -> None:
    """A pair's lookup draft gives each policy a second point set and frontier, named and
    marked by its kind; with one kind the names stay the policies'."""
    trials = make_trials()
    lookup = trials[trials["policy"] == "static"].assign(
        draft_kind="ngram", trial_id=lambda f: f["trial_id"] + "-ngram", speedup=3.0
    )
    both = pd.concat([trials, lookup], ignore_index=True)
    points = data.config_points(both)
    assert set(points.loc[points["policy"] == "static", "draft_kind"]) == {"lm", "ngram"}
    marked = data.mark_frontiers(points, "mean_drafted", "speedup", False, True)
    static_lm = marked[(marked["policy"] == "static") & (marked["draft_kind"] == "lm")]
    assert static_lm["on_front"].all()  # not beaten by the lookup's points: its own front
    figure = charts.frontier_figure(marked, "mean_drafted", "speedup", ("x", "y"))
    lines = {t.name: t for t in figure.data if t.mode == "lines+markers"}
    assert set(lines) == {"adaedl (lm)", "static (lm)", "static (ngram)"}
    assert lines["static (ngram)"].marker.symbol == charts.KIND_SYMBOLS["ngram"]
    assert lines["static (lm)"].line.color == lines["static (ngram)"].line.color
    one_kind = data.mark_frontiers(
        data.config_points(trials), "mean_drafted", "speedup", False, True
    )
    alone = charts.frontier_figure(one_kind, "mean_drafted", "speedup", ("x", "y"))
    assert {t.name for t in alone.data if t.mode == "lines+markers"} == {"adaedl", "static"}
