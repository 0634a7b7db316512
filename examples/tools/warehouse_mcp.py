"""A small MCP server over a local SQLite warehouse, served over streamable HTTP.

The example's (and the tests') query tool: ``query_warehouse`` runs one
read-only SELECT on a warehouse of orders made on first start, ``list_tables``
names its tables, and ``drop_orders`` is there to show a destructive tool
held for approval. Run it with::

    python examples/tools/warehouse_mcp.py --port 8931 [--db /tmp/warehouse.db]

and give a session ``{"tools": {"mcp": [{"url": "http://127.0.0.1:8931/mcp"}]}}``.
"""

from __future__ import annotations

import argparse
import random
import sqlite3
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

REGIONS = ("north", "south", "east", "west")
PRODUCTS = ("widget", "gadget", "gizmo", "doohickey")
MAX_ROWS = 1000


def make_warehouse(path: Path, rows: int = 5000) -> None:
    """Fill a warehouse of ``rows`` orders (the same every time: seeded)."""
    if path.exists():
        return
    rng = random.Random(38)
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, day INTEGER, region TEXT,"
            " product TEXT, quantity INTEGER, price REAL)"
        )
        db.executemany(
            "INSERT INTO orders (day, region, product, quantity, price) VALUES (?, ?, ?, ?, ?)",
            [
                (
                    rng.randrange(1, 101),
                    rng.choice(REGIONS),
                    rng.choice(PRODUCTS),
                    rng.randrange(1, 20),
                    round(rng.uniform(1, 100), 2),
                )
                for _ in range(rows)
            ],
        )


def server(db_path: Path) -> MCPServer:
    """The warehouse's tools over ``db_path``."""
    mcp = MCPServer("warehouse")

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def query_warehouse(sql: str, limit: int = 100) -> list[dict[str, Any]]:
        """Run one read-only SQL SELECT on the warehouse; rows as objects (at most ``limit``)."""
        with connect() as db:
            db.row_factory = sqlite3.Row
            rows = db.execute(sql).fetchmany(min(limit, MAX_ROWS))
            return [dict(row) for row in rows]

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def list_tables() -> list[str]:
        """The warehouse's tables."""
        with connect() as db:
            return [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=True))
    def drop_orders(region: str) -> int:
        """Delete a region's orders (destructive: held for approval by default)."""
        with sqlite3.connect(db_path) as db:
            return db.execute("DELETE FROM orders WHERE region = ?", (region,)).rowcount

    return mcp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8931)
    parser.add_argument("--db", type=Path, default=Path("/tmp/sbx-warehouse.db"))
    args = parser.parse_args()
    make_warehouse(args.db)
    server(args.db).run("streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
