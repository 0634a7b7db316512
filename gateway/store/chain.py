"""Records nobody rewrites unseen: audit events, egress connections and executions chained by hash.

Each record gets one entry in the ``chain`` table, a place in two chains at
once: its tenant's (``tenant_seq``, ``tenant_hash``) and its session's
(``session_seq``, ``session_hash``; none for an audit event of no session).
The entry's ``digest`` is the SHA-256 of the record's canonical JSON (its
table and its columns but the id, in ``TABLES``' order, floats as floats and
flags as 0 or 1); each chain's hash is the SHA-256 of the JSON list of the
hash before it in that chain ('' for the first), the entry's kind, record
id, time, digest and place. ``chain_heads`` holds each chain's count and
newest hash. So an edited record no longer matches its digest, a deleted one
leaves its entry naming nothing, a forged one has no entry, two swapped ones
each hold the other's digest, and an entry removed, edited or moved breaks
the hashes after it (the head, the ones before it).

Entries are made last in the transaction that writes their records (the
database's ``Sealer``): a batch's records are chained in order, each chain's
head read and written once a batch, so the writer's batching stays cheap.
On PostgreSQL the heads' rows are locked (an upsert) in the order of their
names, so gateways appending to one tenant's chain at once take turns,
never fork it and never deadlock; SQLite has one writer. The unique indexes
on each chain's places refuse a fork whatever happens.

An execution's row is rewritten while it runs: it is chained when final, by
the write of its outcome (a row still running is neither chained nor
flagged). Rows written before the chain existed are an unchained prefix:
ids up to the ``unchained:`` rows of ``chain_heads``, counted, not checked.
Records the retention pruned are told apart by their entry's date (or, for
executions, the newer ones their session keeps).

Verifying walks a chain a page at a time, each page one call on the store's
thread: the loop is never held, and a page costs the same whatever the
chain's length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence
from typing import Any

from ..timestamps import iso
from .base import Retention
from .database import Database, Repository

# kind: (its table, the columns its digest covers in order, the one its date is)
TABLES = {
    "audit": (
        "audit",
        ("at", "tenant", "token_id", "action", "session_id", "outcome", "status", "remote",
         "detail"),
        "at",
    ),
    "connection": ("connections", ("session_id", "execution_id", "at", "record"), "at"),
    "execution": (
        "executions",
        ("session_id", "code", "description", "started_at", "review", "execution_count",
         "status", "outputs", "truncated", "error", "ended_at", "duration_ms", "files"),
        "started_at",
    ),
}  # fmt: skip
KIND_OF = {table: kind for kind, (table, _, _) in TABLES.items()}
_FLOATS = {"duration_ms"}
_FLAGS = {"truncated"}
PAGE = 500  # entries (or rows) one call of a verification reads
DIGEST_BATCH = 25  # records read at once to check their digests
MAX_PROBLEMS = 100  # problems a report lists; the rest are counted
TENANTS_CACHED = 4096  # sessions whose tenant is remembered
HEADS_CACHED = 8192  # chains whose head a database's only writer remembers


def digest(kind: str, values: Sequence[Any]) -> str:
    """The SHA-256 of a record's canonical JSON: its table and its columns' values."""
    table, columns, _ = TABLES[kind]
    canonical = [
        float(v) if c in _FLOATS and v is not None else int(bool(v)) if c in _FLAGS else v
        for c, v in zip(columns, values, strict=True)
    ]
    return _sha256([table, *canonical])


def _sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass
class _Entry:
    """A record written in this transaction, to be chained before it commits."""

    kind: str
    record_id: int
    tenant: str | None  # None: its session's
    session_id: str | None
    at: str
    digest: str

    def link(self, before: str, place: int) -> str:
        """Its hash in a chain whose hash before it is ``before``, at ``place``.

        The fields a line each: only ``at`` may hold any text, and the fields
        around it have fixed forms, so the text reads back one way only.
        """
        fields = (before, self.kind, str(self.record_id), self.at, self.digest, str(place))
        return hashlib.sha256("\n".join(fields).encode()).hexdigest()


@dataclasses.dataclass
class _Walk:
    """Where a verification stands in one chain."""

    column: str  # tenant or session
    key: str
    place: int = 0
    hash: str = ""
    pruned: int = 0
    done: bool = False
    advanced: bool = False  # its last page held entries
    sessions: set[str] = dataclasses.field(default_factory=set)  # met in a tenant's chain

    @property
    def name(self) -> str:
        return f"{self.column}:{self.key}"


class _Report:
    def __init__(self) -> None:
        self.problems: list[dict[str, Any]] = []
        self.more = 0

    def add(self, table: str, record: int | str, problem: str, detail: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append({"table": table, "id": record, "problem": problem,
                                  "detail": detail})  # fmt: skip
        else:
            self.more += 1


def _advance(head: list[Any], entry: _Entry) -> list[Any]:
    """Put ``entry`` at the end of a chain whose head (count, hash) is ``head``; its place."""
    head[0] += 1
    head[1] = entry.link(head[1], head[0])
    return list(head)


class Chain(Repository):
    """The ``chain`` and ``chain_heads`` tables: the database's ``Sealer``."""

    def __init__(self, db: Database, retention: Retention) -> None:
        super().__init__(db)
        self.retention = retention
        self._queued: list[_Entry] = []
        self._tenants: dict[str, str] = {}  # session: its tenant
        # Heads as committed, kept when this gateway is the database's only writer
        # (SQLite): a batch then reads none; ``_sealed``: this transaction's new ones.
        self._heads: dict[str, tuple[int, str]] = {}
        self._sealed: dict[str, tuple[int, str]] = {}
        db.sealer = self

    # Writing: on the store's thread, in the transaction of the record's write.

    def insert(
        self, kind: str, values: Sequence[Any], session_id: str | None, tenant: str | None = None
    ) -> None:
        """Write a record (its columns' ``values``, in ``TABLES``' order) and chain it."""
        table, columns, _ = TABLES[kind]
        [row] = self.db.rows(
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
            " RETURNING id",
            tuple(values),
        )
        self.append(kind, row[0], values, session_id, tenant)

    def append(
        self,
        kind: str,
        record_id: int,
        values: Sequence[Any],
        session_id: str | None,
        tenant: str | None = None,
    ) -> None:
        """Chain a record written in this transaction as it commits (``tenant``: its session's)."""
        _, columns, dated = TABLES[kind]
        at = values[columns.index(dated)]
        self._queued.append(_Entry(kind, record_id, tenant, session_id, at, digest(kind, values)))

    def begin(self) -> None:
        self._queued.clear()
        self._sealed = {}

    def committed(self) -> None:
        if not self.db.dialect.shared:
            if len(self._heads) + len(self._sealed) > HEADS_CACHED:
                self._heads.clear()
            self._heads.update(self._sealed)

    def mark(self) -> int:
        return len(self._queued)

    def undo(self, mark: int) -> None:
        del self._queued[mark:]

    def seal(self) -> None:
        """Chain what this transaction wrote, each chain's head locked in the order of names."""
        queued, self._queued = self._queued, []
        if not queued:
            return
        self._learn_tenants({e.session_id for e in queued if e.tenant is None and e.session_id})
        for entry in queued:
            if entry.tenant is None:
                entry.tenant = self._tenants.get(entry.session_id or "", "")
        names = {f"tenant:{e.tenant}" for e in queued}
        names.update(f"session:{e.session_id}" for e in queued if e.session_id)
        heads = self._lock_heads(sorted(names))
        rows = []
        for e in queued:
            places = _advance(heads[f"tenant:{e.tenant}"], e)
            places += _advance(heads[f"session:{e.session_id}"], e) if e.session_id else [None] * 2
            rows.append((e.kind, e.record_id, e.tenant, e.session_id, e.at, e.digest, *places))
        self.db.cursor_many(
            "INSERT INTO chain (kind, record_id, tenant, session_id, at, digest, tenant_seq,"
            " tenant_hash, session_seq, session_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
        self.db.cursor_many(
            "INSERT INTO chain_heads (name, count, hash) VALUES (?, ?, ?) ON CONFLICT (name)"
            " DO UPDATE SET count = excluded.count, hash = excluded.hash",
            [(name, count, newest) for name, (count, newest) in heads.items()],
        )
        self._sealed = {name: (count, newest) for name, (count, newest) in heads.items()}

    def _lock_heads(self, names: list[str]) -> dict[str, list[Any]]:
        """The heads (count, hash) of these chains, none of which another writer may move
        until this transaction ends."""
        if self.db.dialect.shared:  # other gateways append too: lock each row, in name order
            heads = {}
            for name in names:
                [row] = self.db.rows(
                    "INSERT INTO chain_heads (name, count, hash) VALUES (?, 0, '')"
                    " ON CONFLICT (name) DO UPDATE SET count = chain_heads.count"
                    " RETURNING count, hash",
                    (name,),
                )
                heads[name] = [row[0], row[1]]
            return heads
        missing = [name for name in names if name not in self._heads]  # the only writer
        if missing:
            rows = self.db.rows(
                f"SELECT name, count, hash FROM chain_heads"
                f" WHERE name IN ({', '.join('?' * len(missing))})",
                tuple(missing),
            )
            self._heads.update({row[0]: (row[1], row[2]) for row in rows})
        return {name: list(self._heads.get(name, (0, ""))) for name in names}

    def _learn_tenants(self, sessions: set[str]) -> None:
        missing = list(sessions - self._tenants.keys())
        if not missing:
            return
        if len(self._tenants) + len(missing) > TENANTS_CACHED:
            self._tenants.clear()
        rows = self.db.rows(
            f"SELECT id, doc FROM sessions WHERE id IN ({', '.join('?' * len(missing))})",
            tuple(missing),
        )
        for row in rows:
            self._tenants[row["id"]] = json.loads(row["doc"]).get("tenant", "default")

    # Reading

    async def chain_head(self, session_id: str, place: int | None = None) -> dict[str, Any]:
        """A session's chain: how many records it holds and its newest hash ('' for none).

        ``place``: also its hash at that place, as ``at`` ('' at 0, None past the end):
        where an export that counted that many records should find its own head.
        """

        def read() -> dict[str, Any]:
            rows = self.db.rows(
                "SELECT count, hash FROM chain_heads WHERE name = ?", (f"session:{session_id}",)
            )
            head: dict[str, Any] = {"count": rows[0][0], "hash": rows[0][1]} if rows else {
                "count": 0, "hash": ""}  # fmt: skip
            if place is not None:
                found = self.db.rows(
                    "SELECT session_hash FROM chain WHERE session_id = ? AND session_seq = ?",
                    (session_id, place),
                )
                head["at"] = found[0][0] if found else ("" if place == 0 else None)
            return head

        return await self.db.run(read)

    async def verify_chains(
        self, tenant: str | None = None, session_id: str | None = None
    ) -> dict[str, Any]:
        """Walk a session's chain, a tenant's, or (neither given) every tenant's; what is wrong.

        Every entry's hash must follow from the one before it, its record must
        be there (or pruned by the retention) and hash to its digest, the
        chain must end at its head, and every record of the scope past the
        unchained prefix must have an entry.
        """
        report = _Report()
        unchained = {
            row[0].split(":", 1)[1]: row[1]
            for row in await self.db.select(
                "SELECT name, count FROM chain_heads WHERE name LIKE 'unchained:%'"
            )
        }
        if session_id is not None:
            walks = [_Walk("session", session_id)]
        elif tenant is not None:
            walks = [_Walk("tenant", tenant)]
        else:
            rows = await self.db.select(
                "SELECT name FROM chain_heads WHERE name LIKE 'tenant:%' ORDER BY name"
            )
            walks = [_Walk("tenant", row[0].split(":", 1)[1]) for row in rows]
        for walk in walks:
            while not walk.done or not await self.db.run(self._check_head, walk, report):
                await self.db.run(self._walk_page, walk, report)
        for table in unchained:
            if session_id is not None:
                scopes = [("t.session_id = ?", session_id)]
            elif tenant is not None:
                scopes = [("t.session_id = ?", s) for s in sorted(walks[0].sessions)]
                if table == "audit":
                    scopes = [("coalesce(t.tenant, '') = ?", tenant)]
            else:
                scopes = [("1 = ?", 1)]
            for where, key in scopes:
                after: int | None = unchained[table]
                while after is not None:
                    after = await self.db.run(
                        self._unchained_page, table, where, key, after, report
                    )
        return {
            "ok": not report.problems,
            "chains": [
                {"chain": w.name, "count": w.place, "head": w.hash, "pruned": w.pruned}
                for w in walks
            ],
            "problems": report.problems,
            "more_problems": report.more,
            "unchained_before": unchained,
        }

    def _walk_page(self, walk: _Walk, report: _Report) -> None:
        """On the store's thread: check the next page of a chain's entries."""
        key = "tenant" if walk.column == "tenant" else "session_id"
        entries = self.db.rows(
            f"SELECT id, kind, record_id, tenant, session_id, at, digest,"
            f" {walk.column}_seq AS place, {walk.column}_hash AS hash FROM chain"
            f" WHERE {key} = ? AND {walk.column}_seq > ? ORDER BY {walk.column}_seq LIMIT ?",
            (walk.key, walk.place, PAGE),
        )
        walk.done = len(entries) < PAGE
        walk.advanced = bool(entries)
        stored = self._digests(entries)
        chained = {(e["kind"], e["digest"]): e["record_id"] for e in entries}
        for e in entries:
            table = TABLES[e["kind"]][0]
            entry = _Entry(e["kind"], e["record_id"], e["tenant"], e["session_id"], e["at"],
                           e["digest"])  # fmt: skip
            if e["place"] != walk.place + 1:
                report.add("chain", e["id"], "deleted",
                           f"{walk.name} goes from place {walk.place} to {e['place']}:"
                           " entries between are gone")  # fmt: skip
            elif entry.link(walk.hash, e["place"]) != e["hash"]:
                report.add("chain", e["id"], "altered",
                           f"its hash at place {e['place']} of {walk.name} does not follow"
                           " from the entry before it")  # fmt: skip
            walk.place, walk.hash = e["place"], e["hash"]
            if e["session_id"]:
                walk.sessions.add(e["session_id"])
            found = stored.get((e["kind"], e["record_id"]))
            if found is None:
                if self._pruned(e):
                    walk.pruned += 1
                else:
                    named = f"place {e['place']} of {walk.name} names it; it is gone"
                    report.add(table, e["record_id"], "deleted", named)
            elif found != e["digest"]:
                moved = chained.get((e["kind"], found))
                if moved is not None:
                    report.add(table, e["record_id"], "reordered",
                               f"it holds what record {moved} held when chained")  # fmt: skip
                else:
                    report.add(table, e["record_id"], "edited",
                               "its content is not what was chained")  # fmt: skip

    def _digests(self, entries: list[Any]) -> dict[tuple[str, int], str]:
        """The digests of the records a page of entries names, as they are stored now.

        Read ``DIGEST_BATCH`` records at a time: an execution may hold megabytes.
        """
        found = {}
        for kind, (table, columns, _) in TABLES.items():
            ids = [e["record_id"] for e in entries if e["kind"] == kind]
            for at in range(0, len(ids), DIGEST_BATCH):
                batch = ids[at : at + DIGEST_BATCH]
                rows = self.db.rows(
                    f"SELECT id, {', '.join(columns)} FROM {table}"
                    f" WHERE id IN ({', '.join('?' * len(batch))})",
                    tuple(batch),
                )
                found.update({(kind, row[0]): digest(kind, tuple(row)[1:]) for row in rows})
        return found

    def _pruned(self, entry: Any) -> bool:
        """Whether the retention would have pruned this entry's record (audit is never pruned)."""
        if entry["kind"] == "audit":
            return False
        retention = self.retention
        if retention.max_age and entry["at"] < iso(time.time() - retention.max_age):
            return True
        if entry["kind"] != "execution" or not retention.max_executions:
            return False
        [(newer,)] = self.db.rows(
            "SELECT count(*) FROM chain WHERE session_id = ? AND kind = 'execution' AND id > ?",
            (entry["session_id"], entry["id"]),
        )
        return newer >= retention.max_executions

    def _check_head(self, walk: _Walk, report: _Report) -> bool:
        """On the store's thread: whether the walk ended at the chain's head (else a problem);
        False if the chain may have grown since its last page (the walk goes on)."""
        rows = self.db.rows("SELECT count, hash FROM chain_heads WHERE name = ?", (walk.name,))
        count, newest = (rows[0][0], rows[0][1]) if rows else (0, "")
        if count > walk.place and walk.advanced:  # appended to as it was walked: read on
            walk.done = walk.advanced = False
            return False
        if (count, newest) != (walk.place, walk.hash):
            said = f"the head says {count} entries ending {newest[:12] or 'nowhere'}"
            held = f"the chain holds {walk.place} ending {walk.hash[:12] or 'nowhere'}"
            wrong = "deleted" if count > walk.place else "altered"
            report.add("chain_heads", walk.name, wrong, f"{said}; {held}")
        return True

    def _unchained_page(
        self, table: str, where: str, key: Any, after: int, report: _Report
    ) -> int | None:
        """On the store's thread: rows of a page of ``table`` with no entry; the next cursor."""
        running = " AND t.status != 'running'" if table == "executions" else ""
        rows = self.db.rows(
            f"SELECT t.id, c.id FROM {table} t LEFT JOIN chain c ON c.kind = ? AND"
            f" c.record_id = t.id WHERE {where} AND t.id > ?{running} ORDER BY t.id LIMIT ?",
            (KIND_OF[table], key, after, PAGE),
        )
        for record, entry in rows:
            if entry is None:
                report.add(table, record, "inserted", "no chain entry: not written by a gateway")
        return rows[-1][0] if len(rows) == PAGE else None
