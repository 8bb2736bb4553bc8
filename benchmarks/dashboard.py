"""The Grafana dashboard (``docs/grafana-dashboard.json``) and a picture of it.

    python -m benchmarks.dashboard json docs/grafana-dashboard.json
    python -m benchmarks.dashboard render SNAPSHOT_DIR docs/dashboard.png

``render`` draws the dashboard's panels with matplotlib from ``/metrics`` snapshots saved during
a benchmark run (``python -m benchmarks.tracing_overhead --blocks 1 --scrape SNAPSHOT_DIR``: one
server process, so its counters never restart), evaluating each
panel's PromQL the way Prometheus would over those samples (``rate`` between snapshots
``--window`` apart, ``histogram_quantile`` with linear interpolation inside a bucket), so the
picture shows what Grafana would, without a Grafana server.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.dashboard_panels import PANELS, Panel

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


# -- Grafana JSON -------------------------------------------------------------------------------


def grafana(panels: tuple[Panel, ...] = PANELS) -> dict[str, Any]:
    """A Grafana dashboard model (import it: Dashboards → New → Import, pick the Prometheus data
    source that scrapes ``/metrics``)."""
    items: list[dict[str, Any]] = []
    for n, panel in enumerate(panels):
        items.append({
            "id": n + 1,
            "type": "timeseries",
            "title": panel.title,
            "description": panel.description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
            "fieldConfig": {
                "defaults": {
                    "unit": panel.unit,
                    "custom": {"stacking": {"mode": "normal" if panel.stacked else "none"}, "fillOpacity": 20 if panel.stacked else 0},
                },
                "overrides": [],
            },
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
            "targets": [
                {"refId": chr(ord("A") + k), "expr": q.expr, "legendFormat": q.legend, "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                for k, q in enumerate(panel.queries)
            ],
        })
    return {
        "title": "responses-cache",
        "uid": "responses-cache",
        "description": "Per-turn latency, cache tiers, rendering and billing of a responses-cache server (its /metrics).",
        "tags": ["responses-cache"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "10s",
        "time": {"from": "now-15m", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"}]},
        "panels": items,
    }


# -- evaluating the panels over scraped snapshots -----------------------------------------------


def load(directory: Path) -> list[tuple[float, Series]]:
    """Snapshots named ``<unix time>.prom``, oldest first."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[tuple[float, Series]] = []
    for path in sorted(directory.glob("*.prom"), key=lambda p: float(p.stem)):
        series: Series = {}
        for family in text_string_to_metric_families(path.read_text()):
            for sample in family.samples:
                series[(sample.name, frozenset(sample.labels.items()))] = sample.value
        out.append((float(path.stem), series))
    return out


_RATE = re.compile(r"^sum(?: by \((\w+)\) )?\(rate\((\w+)\[[^\]]+\]\)\)$")
_QUANTILE = re.compile(r"^histogram_quantile\(([\d.]+), sum by \(le\) \(rate\((\w+)_bucket\[[^\]]+\]\)\)\)$")


def _rates(before: Series, after: Series, seconds: float, name: str, by: str | None) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (metric, labels), value in after.items():
        if metric != name:
            continue
        delta = value - before.get((metric, labels), 0.0)
        key = dict(labels).get(by, "") if by else ""
        out[key] += max(delta, 0.0) / seconds
    return dict(out)


def _quantile(q: float, before: Series, after: Series, name: str) -> float:
    buckets: dict[float, float] = defaultdict(float)
    for (metric, labels), value in after.items():
        if metric == f"{name}_bucket":
            le = float(dict(labels)["le"])
            buckets[le] += value - before.get((metric, labels), 0.0)
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return math.nan
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for le in bounds:
        if buckets[le] >= rank:
            if math.isinf(le):
                return lower
            return lower + (le - lower) * (rank - below) / max(buckets[le] - below, 1e-12)
        lower, below = le, buckets[le]
    return math.nan


def evaluate(expr: str, before: Series, after: Series, seconds: float) -> dict[str, float]:
    """The value of one panel query between two snapshots, by its legend's label."""
    if (m := _QUANTILE.match(expr)) is not None:
        return {"": _quantile(float(m.group(1)), before, after, m.group(2))}
    if " / " in expr:
        top, bottom = (evaluate(part, before, after, seconds) for part in expr.split(" / "))
        return {k: (v / bottom[k]) if bottom.get(k) else math.nan for k, v in top.items()}
    if (m := _RATE.match(expr)) is not None:
        return _rates(before, after, seconds, m.group(2), m.group(1))
    raise ValueError(f"cannot evaluate {expr!r}")


def render(directory: Path, png: Path, window: int = 3) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    snapshots = load(directory)
    if len(snapshots) <= window:
        raise SystemExit(f"{directory}: {len(snapshots)} snapshots, need more than {window}")
    start = snapshots[0][0]
    rows = math.ceil(len(PANELS) / 2)
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.2 * rows), constrained_layout=True)
    fig.suptitle("responses-cache — the Grafana dashboard's panels over a benchmark run's /metrics", fontsize=12)
    for ax, panel in zip(axes.flat, PANELS, strict=False):
        lines: dict[str, dict[float, float]] = defaultdict(dict)
        for i in range(window, len(snapshots)):
            (t0, before), (t1, after) = snapshots[i - window], snapshots[i]
            for query in panel.queries:
                for key, value in evaluate(query.expr.replace("$__rate_interval", "w"), before, after, t1 - t0).items():
                    legend = query.legend.replace("{{" + _by(query.expr) + "}}", key) if _by(query.expr) else query.legend
                    lines[legend][t1 - start] = value * (1000 if panel.unit == "s" else 1)
        if panel.stacked and lines:
            keys = sorted(lines)
            xs = sorted({x for k in keys for x in lines[k]})
            ax.stackplot(xs, *[_fill([lines[k].get(x, 0.0) for x in xs]) for k in keys], labels=keys, alpha=0.7)
        else:
            for legend, points in sorted(lines.items()):
                ax.plot(sorted(points), [points[x] for x in sorted(points)], label=legend)
        unit = {"s": "ms", "reqps": "per second", "short": "tokens"}[panel.unit]
        ax.set_title(panel.title, fontsize=10)
        ax.set_ylabel(unit, fontsize=8)
        ax.set_xlabel("seconds into the run", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_ylim(bottom=0)
        if lines:
            ax.legend(fontsize=7, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no data in this run", ha="center", va="center", transform=ax.transAxes)
    for ax in list(axes.flat)[len(PANELS):]:
        ax.axis("off")
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def _by(expr: str) -> str:
    m = re.search(r"sum by \((\w+)\) \(rate", expr)
    return m.group(1) if m and m.group(1) != "le" else ""


def _fill(values: list[float]) -> list[float]:
    return [0.0 if math.isnan(v) else v for v in values]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("json", help="write the Grafana dashboard JSON")
    write.add_argument("path", type=Path)
    draw = sub.add_parser("render", help="draw the panels from scraped /metrics snapshots")
    draw.add_argument("snapshots", type=Path)
    draw.add_argument("png", type=Path)
    draw.add_argument("--window", type=int, default=3, help="snapshots per rate window")
    args = parser.parse_args(argv)
    if args.command == "json":
        args.path.write_text(json.dumps(grafana(), indent=2) + "\n")
    else:
        render(args.snapshots, args.png, args.window)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
