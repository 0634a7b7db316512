"""A data-processing agent's flow, end to end, through the Python SDK.

Create a session, upload a CSV, run the analysis in the sandbox, validate
what came back against what the agent knows, download the chart the code
drew, and export the session as a notebook a person can open or replay::

    python examples/data_analysis_agent.py --url http://127.0.0.1:8765 --out results

Writes ``results/sales_by_region.png``, ``results/analysis.ipynb`` and the CSV it
uploaded, ``results/inputs/sales.csv``: what a replay needs, on a fresh gateway too::

    sbx replay results/analysis.ipynb --inputs results/inputs
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import sys
from collections import defaultdict
from pathlib import Path

from gateway.client import Session

LOAD = """\
import pandas as pd

sales = pd.read_csv("sales.csv", parse_dates=["date"])
sales.info()
sales.head()
"""

ANALYSE = """\
import os
import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
from IPython.display import JSON

by_region = sales.groupby("region")["amount"].sum().sort_values(ascending=False)
ax = by_region.plot.bar(title="Sales by region", color="#4c72b0")
ax.set_ylabel("amount")
plt.tight_layout()
os.makedirs("charts", exist_ok=True)
plt.savefig("charts/sales_by_region.png", dpi=80)
JSON({"rows": len(sales), "total": round(float(sales.amount.sum()), 2),
      "by_region": {k: round(float(v), 2) for k, v in by_region.items()}})
"""


def make_sales(rows: int = 500, seed: int = 42) -> str:
    """The input an agent would have been handed: a CSV of sales."""
    rng = random.Random(seed)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["date", "region", "amount"])
    for i in range(rows):
        region = rng.choice(["north", "south", "east", "west"])
        writer.writerow([f"2024-{1 + i % 12:02d}-{1 + i % 28:02d}", region, rng.randint(5, 500)])
    return out.getvalue()


def expected_totals(data: str) -> dict[str, float]:
    """What the agent can check independently of the sandbox."""
    totals: dict[str, float] = defaultdict(float)
    for row in csv.DictReader(io.StringIO(data)):
        totals[row["region"]] += float(row["amount"])
    return dict(totals)


def run(url: str | None, token: str | None, out: Path) -> dict:
    data = make_sales()
    (out / "inputs").mkdir(parents=True, exist_ok=True)
    (out / "inputs" / "sales.csv").write_text(data)  # as uploaded: the export records its hash
    with Session.create(url, token, memory="1g", ttl=600, metadata={"agent": "analysis"}) as s:
        s.files.write("sales.csv", data)
        loaded = s.run(LOAD, description="## Load the sales data")
        if not loaded.ok:
            raise SystemExit(f"loading failed:\n{loaded.error.text}")
        print(loaded.stdout.splitlines()[1])  # "RangeIndex: 500 entries, ..."

        analysed = s.run(ANALYSE, description="## Sales by region, and a chart of them")
        if not analysed.ok:
            raise SystemExit(f"analysis failed:\n{analysed.error.text}")
        summary = analysed.result.json

        # Validate before trusting: the sandbox's numbers must match the agent's own.
        expected = expected_totals(data)
        if summary["rows"] != 500 or summary["by_region"].keys() != expected.keys():
            raise SystemExit(f"unexpected summary: {summary}")
        for region, total in expected.items():
            if abs(summary["by_region"][region] - total) > 0.01:
                raise SystemExit(
                    f"{region}: sandbox says {summary['by_region'][region]}, not {total}"
                )
        if [a.path for a in analysed.artifacts] != ["charts/sales_by_region.png"]:
            raise SystemExit(f"expected one chart, got {analysed.artifacts}")

        chart = s.files.download("charts/sales_by_region.png", out / "sales_by_region.png")
        notebook = s.export(out / "analysis.ipynb")
    print(f"validated: total {summary['total']} over {len(expected)} regions")
    print(f"chart: {chart} ({chart.stat().st_size} bytes)")
    print(f"notebook: {out / 'analysis.ipynb'} ({len(notebook['cells'])} cells)")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="gateway URL (default: SBX_URL or http://127.0.0.1:8765)")
    parser.add_argument("--token", help="bearer token (default: SBX_TOKEN)")
    parser.add_argument("--out", type=Path, default=Path("results"), help="where files go")
    args = parser.parse_args(argv)
    run(args.url, args.token, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
