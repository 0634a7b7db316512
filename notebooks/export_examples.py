"""Re-create the example notebooks from real sessions on a running gateway.

Usage: .venv/bin/python notebooks/export_examples.py [--url http://127.0.0.1:8765]

Each example is what an agent would send: code steps with a markdown
description, run in one session, then exported with GET .../notebook.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent

ANALYSIS = [
    (
        "# Regional sales\nThe agent builds the quarter's order table (fixed seed, so it replays).",
        "import numpy as np\nimport pandas as pd\n\n"
        "rng = np.random.default_rng(7)\n"
        "orders = pd.DataFrame({\n"
        "    'region': rng.choice(['north', 'south', 'east', 'west'], size=200),\n"
        "    'units': rng.integers(1, 20, size=200),\n"
        "    'price': rng.choice([9.5, 12.0, 20.0], size=200),\n"
        "})\n"
        "orders['revenue'] = orders.units * orders.price\n"
        "print(f'{len(orders)} orders, {orders.revenue.sum():,.2f} total revenue')",
    ),
    (
        "Revenue by region, as a table.",
        "by_region = orders.groupby('region').agg(orders=('units', 'size'), "
        "units=('units', 'sum'), revenue=('revenue', 'sum')).sort_values('revenue', "
        "ascending=False)\nby_region",
    ),
    (
        "And as a chart.",
        "import matplotlib.pyplot as plt\n\n"
        "fig, ax = plt.subplots(figsize=(6, 3.5))\n"
        "by_region.revenue.plot.bar(ax=ax, color='#4c72b0')\n"
        "ax.set_ylabel('revenue')\nax.set_title('Revenue by region')\n"
        "fig.tight_layout()\nplt.show()",
    ),
    (
        "The agent's conclusion.",
        "top = by_region.index[0]\n"
        "share = by_region.revenue.iloc[0] / by_region.revenue.sum()\n"
        "print(f'{top} leads with {share:.1%} of revenue')",
    ),
]

ERROR_MIDWAY = [
    (
        "# A failed step\nThe agent loads a config and reads a key that is not there.",
        "config = {'threshold': 0.8, 'window': 7}\nprint(sorted(config))",
    ),
    ("The wrong key raises; the session keeps its state.", "config['thresold']"),
    (
        "The agent corrects itself and carries on.",
        "threshold = config['threshold']\nprint('threshold is', threshold)",
    ),
]


def export(client: httpx.Client, steps: list[tuple[str, str]], name: str) -> None:
    session = client.post("/v1/sessions", json={"metadata": {"example": name}}).json()
    try:
        for description, code in steps:
            body = {"code": code, "description": description}
            client.post(f"/v1/sessions/{session['id']}/execute", json=body).raise_for_status()
        nb = client.get(f"/v1/sessions/{session['id']}/notebook").json()
    finally:
        client.delete(f"/v1/sessions/{session['id']}")
    (HERE / f"{name}.ipynb").write_text(json.dumps(nb, indent=1) + "\n")
    print(f"wrote notebooks/{name}.ipynb")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765")
    args = parser.parse_args()
    with httpx.Client(base_url=args.url, timeout=120) as client:
        export(client, ANALYSIS, "sales-analysis")
        export(client, ERROR_MIDWAY, "error-midway")


if __name__ == "__main__":
    main()
