"""Benchmark reporting: Pareto frontiers, QPS at a target recall, tables, JSON and plots."""
from __future__ import annotations

import json
import os

import numpy as np


def frontier(points: list[dict], x: str = "recall", y: str = "qps") -> list[dict]:
    """Points not dominated in (higher ``x``, higher ``y``), ascending in ``x``."""
    pts = sorted(points, key=lambda p: (-p[x], -p[y]))
    out, best = [], -np.inf
    for p in pts:
        if p[y] > best:
            out.append(p)
            best = p[y]
    return out[::-1]


def at_recall(points: list[dict], target: float, y: str = "qps") -> float | None:
    """``y`` at recall ``target`` on the frontier, interpolated linearly between the two
    measured settings around it (None if the target is never reached)."""
    f = frontier(points, "recall", y)
    reach = [p for p in f if p["recall"] >= target]
    if not reach:
        return None
    hi = reach[0]
    below = [p for p in f if p["recall"] < target]
    if not below:
        return float(hi[y])
    lo = below[-1]
    t = (target - lo["recall"]) / (hi["recall"] - lo["recall"])
    return float(lo[y] + t * (hi[y] - lo[y]))


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """Plain-text table; ``columns`` are ``(key, header, format)``."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("" if r.get(k) is None else format(r[k], f)) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c[i].rjust(widths[i]) for i in range(len(columns))) for c in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: str, obj: dict) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, default=float)


def save_figure(fig, path: str) -> None:
    """Lay out, write (creating the directory) and close a matplotlib figure."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_recall_qps(path: str, curves: dict[str, list[dict]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in curves.items():
        pts = sorted(pts, key=lambda p: p["recall"])
        ax.plot([p["recall"] for p in pts], [p["qps"] for p in pts], marker="o", ms=3, label=name)
    ax.set_xlabel("recall@10")
    ax.set_ylabel("queries per second (batch, 1 thread)")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend()
    save_figure(fig, path)


def markdown_summary(result_files: list[str]) -> str:
    """One markdown table over ``recall_qps`` result files (for the README)."""
    lines = ["| data set | method | build s | RSS open MiB | QPS @0.90 | x IVF | p50 ms @0.90 | QPS @0.95 | x IVF | p50 ms @0.95 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(v, fmt):
        return "n/a" if v is None else format(v, fmt)

    for path in result_files:
        with open(path) as fh:
            res = json.load(fh)
        meta = res["meta"]
        label = f"{meta['dataset']} ({meta['n']:,} x {meta['dim']}, {meta['metric']})"
        for row in res["summary"]:
            lines.append(
                f"| {label} | {row['method']} | {row['build_s']:.1f} | {row['rss_mib']:.0f} | "
                f"{f(row.get('qps@0.9'), '.0f')} | {f(row.get('vs_ivf@0.9'), '.2f')} | {f(row.get('p50@0.9'), '.3f')} | "
                f"{f(row.get('qps@0.95'), '.0f')} | {f(row.get('vs_ivf@0.95'), '.2f')} | {f(row.get('p50@0.95'), '.3f')} |")
            label = ""
    return "\n".join(lines)


def markdown_dataset(result_file: str) -> str:
    """One ``recall_qps`` result file as docs/benchmarks.md's table of that data set."""
    with open(result_file) as fh:
        res = json.load(fh)
    meta = res["meta"]
    lines = [f"{meta['dataset']} (n={meta['n']}, d={meta['dim']}, {meta.get('queries', '?')} queries):", "",
             "| method | QPS@0.95 | p50 ms@0.95 | QPS@0.9 | p50 ms@0.9 | RSS open MiB | RSS after a search MiB "
             "| 2 threads x@0.95 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def f(v, fmt):
        return "" if v is None else format(v, fmt)

    for row in res["summary"]:
        lines.append(f"| {row['method']} | {f(row.get('qps@0.95'), '.0f')} | {f(row.get('p50@0.95'), '.3f')} | "
                     f"{f(row.get('qps@0.9'), '.0f')} | {f(row.get('p50@0.9'), '.3f')} | {f(row.get('rss_mib'), '.0f')} | "
                     f"{f(row.get('rss_search_mib'), '.0f')} | {f(row.get('threads2_x@0.95'), '.2f')} |")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--dataset"]:
        print("\n\n".join(markdown_dataset(p) for p in sys.argv[2:]))
    else:
        print(markdown_summary(sys.argv[1:]))
