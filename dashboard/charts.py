"""Plotly figure builders for the dashboard pages (data in, figure out; no Streamlit).

Each policy keeps one colour on every page (:func:`policy_colors`); the greedy oracle is drawn
as black stars and the AR baseline in grey, as references rather than competitors. Where the
trials have drafts of several kinds (``trials.draft_kind``), the Pareto view draws each policy
once per kind, labelled ``policy (kind)`` and marked by the kind's symbol (:data:`KIND_SYMBOLS`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from dashboard.data import BASELINE_POLICY, ORACLE_POLICY, policy_kind_label

#: Drafting policies in a fixed order, so each gets the same palette colour everywhere.
POLICY_ORDER = (
    "static",
    "max_confidence",
    "adaedl",
    "svip",
    "hf_heuristic",
    "specdecpp",
    "beta_ts",
    "cali_ts",
)
PALETTE = px.colors.qualitative.Plotly
ORACLE_COLOUR = "#000000"
BASELINE_COLOUR = "#7f7f7f"
HOVER_COLUMNS = (
    "policy",
    "threshold",
    "max_draft_len",
    "n_trials",
    "tokens_per_s",
    "speedup",
    "acceptance_rate",
    "draft_kind",
)
_HOVER = (
    "<b>%{customdata[0]}</b> (%{customdata[7]} draft)<br>threshold %{customdata[1]}<br>max "
    "draft length %{customdata[2]}<br>trials %{customdata[3]}<br>tokens/s "
    "%{customdata[4]:.3g}<br>speedup %{customdata[5]:.3g}<br>acceptance %{customdata[6]:.3g}"
    "<br>x %{x:.3g}, y %{y:.3g}<extra></extra>"
)
#: The marker of each draft kind's points on the Pareto view.
KIND_SYMBOLS = {"lm": "circle", "ngram": "diamond", "eagle": "square"}


def policy_colors(policies: Iterable[str]) -> dict[str, str]:
    """Return {policy: colour}: known policies by their fixed slot, others after, in name order.

    The oracle is black and the AR baseline grey on every chart.
    """
    known = list(POLICY_ORDER)
    extra = sorted(set(policies) - set(known) - {ORACLE_POLICY, BASELINE_POLICY})
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate([*known, *extra])}
    colours[ORACLE_POLICY] = ORACLE_COLOUR
    colours[BASELINE_POLICY] = BASELINE_COLOUR
    return {name: colours[name] for name in policies}


def frontier_figure(
    points: pd.DataFrame,
    x: str,
    y: str,
    titles: tuple[str, str],
    speedup_reference: bool = False,
) -> go.Figure:
    """Return the Pareto view: every setting as a dot, each policy's front as a line.

    ``points`` come from ``data.mark_frontiers``. The oracle and the AR baseline are drawn as
    reference markers; ``speedup_reference`` adds the speedup-1 line of the baseline.
    """
    figure = go.Figure()
    colours = policy_colors(points["policy"].unique())
    drafting = points[~points["is_baseline"] & (points["policy"] != ORACLE_POLICY)]
    several = drafting["draft_kind"].nunique(dropna=False) > 1
    for (policy, kind), rows in drafting.groupby(["policy", "draft_kind"], sort=True):
        name = policy_kind_label(policy, kind) if several else str(policy)
        colour, symbol = colours[policy], KIND_SYMBOLS.get(str(kind), "circle")
        style = dict(size=9, opacity=0.45, symbol=symbol)
        figure.add_trace(_markers(rows, x, y, name, colour, style))
        if {f"{y}_low", f"{y}_high"} <= set(rows.columns):
            figure.add_trace(_error_bars(rows, x, y, name, colour))
        front = rows[rows["on_front"]].sort_values([x, y])
        figure.add_trace(
            go.Scatter(
                x=front[x],
                y=front[y],
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(
                    color=colour, width=3, dash="dot" if several and kind != "lm" else "solid"
                ),
                marker=dict(color=colour, size=11, symbol=symbol),
                customdata=front[list(HOVER_COLUMNS)],
                hovertemplate=_HOVER,
            )
        )
    oracle = points[points["policy"] == ORACLE_POLICY]
    if not oracle.empty:
        style = dict(size=16, symbol="star", line=dict(width=1, color="white"))
        figure.add_trace(_markers(oracle, x, y, "greedy oracle", ORACLE_COLOUR, style, True))
    baseline = points[points["is_baseline"]]
    if not baseline.empty:
        style = dict(size=14, symbol="x")
        figure.add_trace(_markers(baseline, x, y, "AR baseline", BASELINE_COLOUR, style, True))
    if speedup_reference:
        figure.add_hline(
            y=1.0,
            line=dict(color=BASELINE_COLOUR, dash="dash"),
            annotation_text="AR baseline (speedup 1)",
            annotation_position="bottom right",
        )
    figure.update_layout(
        xaxis_title=titles[0], yaxis_title=titles[1], legend_title_text="policy", height=480
    )
    return figure


def _markers(
    rows: pd.DataFrame,
    x: str,
    y: str,
    name: str,
    colour: str,
    style: dict,
    show_legend: bool = False,
) -> go.Scatter:
    """Return a marker-only trace of ``rows`` with the config hover label."""
    return go.Scatter(
        x=rows[x],
        y=rows[y],
        mode="markers",
        name=name,
        legendgroup=name,
        showlegend=show_legend,
        marker=dict(color=colour, **style),
        customdata=rows[list(HOVER_COLUMNS)],
        hovertemplate=_HOVER,
    )


def _error_bars(rows: pd.DataFrame, x: str, y: str, name: str, colour: str) -> go.Scatter:
    """Return invisible markers carrying ``y``'s 95% interval as asymmetric error bars."""
    return go.Scatter(
        x=rows[x],
        y=rows[y],
        mode="markers",
        name=f"{name} 95% CI",
        legendgroup=name,
        showlegend=False,
        hoverinfo="skip",
        customdata=rows[list(HOVER_COLUMNS)],
        marker=dict(color=colour, size=1, opacity=0),
        error_y=dict(
            type="data",
            symmetric=False,
            array=(rows[f"{y}_high"] - rows[y]).tolist(),
            arrayminus=(rows[y] - rows[f"{y}_low"]).tolist(),
            color=colour,
            thickness=1.5,
            width=4,
        ),
    )


def position_acceptance_figure(rates: pd.DataFrame) -> go.Figure:
    """Return the acceptance rate of the draft token at each position, one line per policy."""
    figure = px.line(
        rates,
        x="position",
        y="rate",
        color="policy",
        markers=True,
        color_discrete_map=policy_colors(rates["policy"].unique()),
        hover_data=["drafted", "accepted"],
    )
    figure.update_layout(
        xaxis_title="draft position i",
        yaxis_title="P(token i accepted | drafted)",
        yaxis_range=[0, 1.05],
        height=420,
    )
    return figure


def accepted_length_figure(shares: pd.DataFrame) -> go.Figure:
    """Return the share of rounds per accepted length, bars grouped by policy."""
    figure = px.bar(
        shares,
        x="length",
        y="fraction",
        color="policy",
        barmode="group",
        color_discrete_map=policy_colors(shares["policy"].unique()),
        hover_data=["rounds"],
    )
    figure.update_layout(
        xaxis_title="draft tokens accepted in a round", yaxis_title="share of rounds", height=420
    )
    return figure


def cost_fit_figure(totals: pd.DataFrame) -> go.Figure:
    """Return measured vs predicted trial seconds, one marker symbol per fit, with y = x."""
    figure = px.scatter(
        totals,
        x="measured_s",
        y="predicted_s",
        color="policy",
        symbol="fit",
        color_discrete_map=policy_colors(totals["policy"].unique()),
        hover_data=["trial_id", "relative_error"],
    )
    if not totals.empty:
        low = float(min(totals["measured_s"].min(), totals["predicted_s"].min()))
        high = float(max(totals["measured_s"].max(), totals["predicted_s"].max()))
        figure.add_shape(
            type="line",
            x0=low,
            y0=low,
            x1=high,
            y1=high,
            line=dict(color=BASELINE_COLOUR, dash="dash"),
        )
    figure.update_layout(
        xaxis_title="measured trial seconds", yaxis_title="predicted seconds", height=420
    )
    return figure


def speedup_temperature_figure(best: pd.DataFrame) -> go.Figure:
    """Return speedup vs temperature, one line per policy (its best setting at each temperature)."""
    figure = px.line(
        best,
        x="temperature",
        y="speedup",
        color="policy",
        markers=True,
        color_discrete_map=policy_colors(best["policy"].unique()),
        hover_data=["threshold", "max_draft_len", "n_trials"],
    )
    figure.add_hline(y=1.0, line=dict(color=BASELINE_COLOUR, dash="dash"))
    figure.update_layout(yaxis_title="speedup over AR (best setting)", height=420)
    return figure


def threshold_figure(means: pd.DataFrame) -> go.Figure:
    """Return tokens/s vs threshold, one line per policy and max draft length."""
    data = means.assign(K=means["max_draft_len"].astype(int).astype(str))
    figure = px.line(
        data,
        x="threshold",
        y="tokens_per_s",
        color="policy",
        line_dash="K",
        markers=True,
        color_discrete_map=policy_colors(data["policy"].unique()),
        hover_data=["n_trials"],
    )
    figure.update_layout(yaxis_title="tokens/s", legend_title_text="policy, K", height=420)
    return figure


def length_distribution_figure(distribution: pd.DataFrame) -> go.Figure:
    """Return the drafted and accepted length histograms per round, side by side per policy."""
    figure = px.bar(
        distribution,
        x="length",
        y="fraction",
        color="policy",
        facet_col="kind",
        barmode="group",
        color_discrete_map=policy_colors(distribution["policy"].unique()),
        hover_data=["rounds"],
        category_orders={"kind": ["drafted", "accepted"]},
    )
    figure.update_layout(yaxis_title="share of rounds", height=420)
    return figure


def comparison_figure(table: pd.DataFrame, metric: str) -> go.Figure:
    """Return the B − A difference of ``metric`` per policy, grouped by dataset."""
    column = f"{metric} Δ"
    figure = px.bar(
        table,
        x="policy",
        y=column,
        color="dataset",
        barmode="group",
        hover_data=[f"{metric} A", f"{metric} B"],
    )
    figure.add_hline(y=0.0, line=dict(color=BASELINE_COLOUR))
    figure.update_layout(yaxis_title=f"{metric}: B − A", height=380)
    return figure


def batch_speedup_figure(best: pd.DataFrame, speedup: str, label: str) -> go.Figure:
    """Return speedup vs batch size (log axis), one line per policy and pair (its best setting
    at each batch size), with the speedup-1 line where speculation stops paying."""
    figure = px.line(
        best,
        x="batch_size",
        y=speedup,
        color="policy",
        line_dash="pair",
        markers=True,
        log_x=True,
        color_discrete_map=policy_colors(best["policy"].unique()),
        hover_data=["threshold", "max_draft_len", "n_trials"],
    )
    figure.add_hline(y=1.0, line=dict(color=BASELINE_COLOUR, dash="dash"))
    figure.update_layout(
        xaxis_title="batch size",
        yaxis_title=f"{label} speedup over AR at the same batch size (best setting)",
        height=440,
    )
    return figure


def throughput_latency_figure(points: pd.DataFrame) -> go.Figure:
    """Return total tokens/s against per-sequence tokens/s, one line per setting through its
    batch sizes (each point labelled with its batch size)."""
    figure = px.line(
        points,
        x="tokens_per_s",
        y="total_tokens_per_s",
        color="policy",
        line_group="setting",
        markers=True,
        text="batch_size",
        color_discrete_map=policy_colors(points["policy"].unique()),
        hover_data=["setting", "batch_size", "n_trials"],
    )
    figure.update_traces(textposition="top center")
    figure.update_layout(
        xaxis_title="per-sequence tokens/s (what a user waits for)",
        yaxis_title="total tokens/s (throughput)",
        height=440,
    )
    return figure
