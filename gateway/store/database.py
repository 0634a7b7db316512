"""The store's connection: a dialect, the writer that runs calls on it, and its transactions.

The repositories (one per table or two) write their SQL once, with ``?``
placeholders and the dialect's clock (``now``) and insertion order
(``row_order``); the ``Dialect`` says what differs between SQLite and
PostgreSQL: how to connect and migrate, how its driver spells a
placeholder, where execution ids come from, where a gateway's id is kept,
and which errors mean the server is gone.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..errors import StoreUnavailable
from .writer import Call, Checkpoints, Outcome, Writer

T = TypeVar("T")


class Ids(Protocol):
    """Where execution ids come from; handed out on the loop, so nothing waits for an insert."""

    def start(self) -> None:
        """On the store's thread, once migrated: where the ids go on from."""

    def next(self) -> int:
        """One id, on the loop."""

    async def reserve(self, count: int) -> int:
        """``count`` consecutive ids; the first."""

    def keep_newest(self) -> None:
        """On the store's thread, before pruning: an id pruned is never handed out again."""


class Sealer(Protocol):
    """Work a transaction does last, over what its calls queued (the hash chain, ``chain.py``)."""

    def begin(self) -> None:
        """A transaction starts: what a rolled back one queued is gone."""

    def mark(self) -> int:
        """A call starts in a savepoint: where its queued work begins."""

    def undo(self, mark: int) -> None:
        """The call was rolled back to its savepoint: drop what it queued."""

    def seal(self) -> None:
        """Before the commit: do the queued work, in the transaction."""

    def committed(self) -> None:
        """The transaction committed: what it sealed holds."""


class Dialect(abc.ABC):
    """What one kind of database does its own way."""

    now: str  # the database's clock, in seconds, as an SQL expression
    row_order: str  # the column that orders rows as they were inserted
    shared: bool  # whether other gateways may use the same database
    loop_writes: bool  # whether single-row writes may commit on the loop (see writer)
    connection_errors: tuple[type[Exception], ...] = ()  # the server went away
    # Taken before what other gateways sharing the database count too (quota claims, volume
    # mounts, a template's tags); None where none do.
    claims_lock: str | None = None

    @abc.abstractmethod
    def connect(self) -> Any:
        """On the store's thread: a connection in autocommit mode, its rows read by name."""

    @abc.abstractmethod
    def migrate(self, db: Any) -> None:
        """On the store's thread: bring the schema up to the newest migration."""

    @abc.abstractmethod
    def ids(self, database: Database) -> Ids:
        """Where this database's execution ids come from."""

    @abc.abstractmethod
    def gateway_id(self, database: Database) -> str:
        """On the store's thread: this gateway's stable id (it labels its containers)."""

    def checkpoints(self, database: Database) -> Checkpoints | None:
        """What the writer copies beside the writes, if anything (SQLite's WAL)."""
        return None

    def usable(self, db: Any) -> Any:
        """On the store's thread, before a batch: the connection, made again if it broke."""
        return db

    @staticmethod
    def statement(sql: str) -> str:
        """A statement written with ``?`` placeholders, as the driver takes it."""
        return sql


class Database:
    """One connection, on the writer's thread (or the loop, for quick batches)."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self.down: str | None = None  # why the server did not answer the last batch
        self._db: Any = None
        self._opened: list[Callable[[], None]] = []
        self.ids = dialect.ids(self)
        self.sealer: Sealer | None = None  # the facade's chain
        self.writer = Writer(
            self.run_batch, self.is_open, dialect.loop_writes, dialect.checkpoints(self)
        )

    def is_open(self) -> bool:
        return self._db is not None

    def on_open(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` on the store's thread once the schema is current (a repository's setup)."""
        self._opened.append(hook)

    async def open(self) -> None:
        await self.run(self._open)

    def _open(self) -> None:
        db = self.dialect.connect()
        self.dialect.migrate(db)
        self._db = db
        self.ids.start()
        for hook in self._opened:
            hook()

    async def close(self) -> None:
        """Finish what is queued, close the connection, end the threads."""
        if self._db is not None:
            await self.run(lambda: None)
            db, self._db = self._db, None
            await self.writer.on_thread(db.close)
        await self.writer.stop()

    def submit(
        self, fn: Callable[..., T], *args: Any, lazy: bool = False, quick: bool = False
    ) -> Any:
        """Queue a call (see ``Writer.submit``); its future."""
        return self.writer.submit(fn, *args, lazy=lazy, quick=quick)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await self.writer.run(fn, *args)

    def cursor(self, sql: str, params: tuple = ()) -> Any:
        """On the store's thread: run one statement; its cursor (rows, rowcount)."""
        assert self._db is not None, "store is not open"
        return self._db.execute(self.dialect.statement(sql), params)

    def cursor_many(self, sql: str, params: list[tuple]) -> None:
        """On the store's thread: run one statement for each of ``params``."""
        assert self._db is not None, "store is not open"
        self._db.cursor().executemany(self.dialect.statement(sql), params)

    def rows(self, sql: str, params: tuple = ()) -> list[Any]:
        """On the store's thread: run one statement; the rows it returned."""
        cursor = self.cursor(sql, params)
        return cursor.fetchall() if cursor.description else []

    async def select(self, sql: str, params: tuple = ()) -> list[Any]:
        """Run one statement in its turn; the rows it returned."""
        return await self.run(self.rows, sql, params)

    def run_batch(self, calls: list[Call]) -> list[Outcome]:
        """Run calls in one transaction; (ok, result or error) each.

        While the server does not answer, every batch fails with
        ``StoreUnavailable`` and ``down`` says why, until one goes through.
        """
        try:
            if self._db is not None:
                self._db = self.dialect.usable(self._db)
            outcomes = self._transact(calls)
        except self.dialect.connection_errors as e:
            self.down = str(e).splitlines()[0]
            raise StoreUnavailable(
                f"the gateway's database does not answer ({self.down}); try again shortly"
            ) from e
        self.down = None
        return outcomes

    def _transact(self, calls: list[Call]) -> list[Outcome]:
        db = self._db
        outcomes: list[Outcome] = []
        if db is None:  # opening: the migrations manage their own transactions
            for fn, args in calls:
                try:
                    outcomes.append((True, fn(*args)))
                except Exception as e:
                    outcomes.append((False, e))
            return outcomes
        sealer = self.sealer
        assert sealer is not None, "the facade gives its database a sealer"
        db.execute("BEGIN")
        sealer.begin()
        try:  # the usual case, nothing fails: no savepoints (they cost as much as the writes)
            outcomes = [(True, fn(*args)) for fn, args in calls]
            sealer.seal()
        except Exception:
            db.execute("ROLLBACK")
        else:
            db.execute("COMMIT")
            sealer.committed()
            return outcomes
        # Again from the start, each call in a savepoint: a failing one undoes only itself.
        outcomes = []
        db.execute("BEGIN")
        sealer.begin()
        try:
            for fn, args in calls:
                db.execute("SAVEPOINT call")
                mark = sealer.mark()
                try:
                    outcomes.append((True, fn(*args)))
                except Exception as e:
                    db.execute("ROLLBACK TO call")
                    sealer.undo(mark)
                    outcomes.append((False, e))
                db.execute("RELEASE call")
            sealer.seal()
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        sealer.committed()
        return outcomes


class Repository:
    """The statements of one table (or two read together), run on the store's database."""

    def __init__(self, db: Database) -> None:
        self.db = db


@functools.lru_cache(maxsize=512)
def format_placeholders(sql: str) -> str:
    """``?`` placeholders as ``%s`` (psycopg's), a literal ``%`` as ``%%``; quoted text kept."""
    out, quoted = [], False
    for char in sql:
        if char == "'":
            quoted = not quoted
        if char == "%":
            out.append("%%")
        elif char == "?" and not quoted:
            out.append("%s")
        else:
            out.append(char)
    return "".join(out)
