"""How a paused session keeps its kernel's state, and what each strategy loses.

``KernelState`` saves a running kernel's state before its sandbox is removed,
and restores it into a fresh kernel over the same workspace. Strategies, best
first (``STRATEGIES``); a session gets the best one its kernel supports:

- ``checkpoint``: the whole process tree through gVisor's checkpoint/restore.
  Not available (``CHECKPOINT_UNAVAILABLE`` says why).
- ``namespace``: kernels whose kernelspec lists it (``metadata.sandbox.state``;
  ipykernel). The user namespace is saved with dill into the directory the
  kernel shares with this host (``Placement.kernel_exchange``), moved out of
  the sandbox's reach, and loaded into the fresh kernel. Every name dill
  cannot save (a generator, a socket, a thread) and every open file is listed
  in ``lost``, never dropped silently.
- ``replay``: any kernel. The session's recorded cells run again, in order, in
  the fresh kernel over the kept workspace; cells whose outputs differ from
  the recorded ones are reported.

A session holding sealed secrets keeps its state by replay only: a saved
namespace holds their values, and whatever the kernel made of them, in the
clear, on disk and in every fork (whose masker would not know them). Its
history is masked, and a kernel that replays it has a secret only if its
session asks for it.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import errno
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import StateNotRestored, StateNotSaved, StrategyUnavailable
from ..execution.outputs import OutputCap
from ..execution.recorder import ran_in_kernel
from ..store.base import HISTORY_PAGE_MAX, Store
from ..workspace.rules import remove_tree
from .lifecycle import SandboxLifecycle
from .model import Session
from .requests import STRATEGIES

CHECKPOINT_UNAVAILABLE = (
    "the checkpoint strategy is not available here: gVisor's runsc refuses to checkpoint a "
    "kernel's sockets (a bound or connected host Unix socket, or a listening one inside the "
    "sandbox), and every kernel listens on five (CRIU for runc does not work on this host's "
    "kernel); ask for 'namespace' (Python) or 'replay', or for none to get the best available"
)
STATE_DIR = "state"  # in the session's directory, out of the sandbox's reach
STATE_FILE = "namespace.pkl"  # in the session's state directory
CHECKPOINT_FILE = "checkpoint"  # beside it: a crash checkpoint (``crashes``), kept by a resume
_EXCHANGED = ".sbx-namespace.pkl"  # the same file in the kernel's exchange directory
_MAX_LOST = 1000
# Compares a recorded cell's outputs with a replayed one's: a diff, empty when alike.
Diff = Callable[[list[dict[str, Any]], list[dict[str, Any]]], str]

# Run in the kernel. Names IPython keeps for itself (In, Out, _, _i3, _3, dunders)
# are not the user's; every other name is saved or listed as lost.
_SAVE = """
def _sbx_save(path, limit):
    import io, json, os, re, dill
    ip = get_ipython()
    class Capped:
        def __init__(self, f):
            self.f, self.left = f, limit
        def write(self, data):
            if self.left is not None:
                self.left -= len(data)
                if self.left < 0:
                    raise OverflowError(f"the namespace is larger than {{limit}} bytes")
            return self.f.write(data)
    own = re.compile(r"_+|_i+|_i?\\d+|_[io]h|_dh|__\\w+__|_sbx_\\w*")
    names = {{k: v for k, v in ip.user_ns.items()
             if k not in ip.user_ns_hidden and not own.fullmatch(k)}}
    lost = []
    def drop(name, why):
        lost.append({{"name": name, "type": type(names.pop(name)).__qualname__, "reason": why}})
    for name, value in list(names.items()):
        if isinstance(value, io.IOBase):
            drop(name, "an open file: open it again after the resume")
    try:
        with open(path + ".tmp", "wb") as f:
            try:
                dill.dump(names, Capped(f), protocol=5)
            except OverflowError:
                raise
            except Exception:
                for name, value in list(names.items()):
                    try:
                        dill.dumps(value, protocol=5)
                    except Exception as e:
                        drop(name, f"{{type(e).__name__}}: {{e}}"[:300])
                f.seek(0)
                f.truncate()
                dill.dump(names, Capped(f), protocol=5)
    except BaseException:
        os.unlink(path + ".tmp")
        raise
    os.replace(path + ".tmp", path)
    return json.dumps({{"lost": lost, "execution_count": ip.execution_count}})
_sbx_saved = _sbx_save({path!r}, {limit!r})
del _sbx_save
"""
_LOAD = """
def _sbx_load(path, count):
    import os, dill
    ip = get_ipython()
    with open(path, "rb") as f:
        names = dill.load(f)
    os.unlink(path)
    ip.user_ns.update(names)
    ip.execution_count = count
    return len(names)
_sbx_loaded = _sbx_load({path!r}, {count})
del _sbx_load
"""


@dataclasses.dataclass(frozen=True)
class SavedState:
    """What a pause kept of a kernel: how, what it lost, and where its count stood."""

    strategy: str
    lost: list[dict[str, str]]
    execution_count: int
    saved_at: float
    deepens_at: float | None = None  # frozen: when its state is saved to disk at the latest

    def to_json(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        if self.deepens_at is None:
            del doc["deepens_at"]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SavedState:
        return cls(
            doc["strategy"], doc["lost"], doc["execution_count"], doc["saved_at"],
            doc.get("deepens_at"),
        )  # fmt: skip


class KernelState:
    """Saves a kernel's state beside its workspace and restores it into a fresh kernel."""

    def __init__(self, lifecycle: SandboxLifecycle, store: Store, diff: Diff, grace: float) -> None:
        """``diff`` compares outputs for the replay strategy (``notebooks.compare``)."""
        self.lifecycle = lifecycle
        self.store = store
        self.diff = diff
        self.grace = grace

    def strategies(self, session: Session) -> list[str]:
        """The strategies a session's kernel supports, best first (replay, if it holds secrets)."""
        placement = self.lifecycle.placement
        if placement.kernel_exchange(session.id) is None:
            return []
        offered = self.lifecycle.kernelspecs.sandbox(session.kernel_name).get("state", [])
        if session.secret_names:
            offered = [s for s in offered if s != "namespace"]
        return [s for s in STRATEGIES if s in offered or s == "replay"]

    def choose(self, session: Session, requested: str | None) -> str:
        """The strategy to use: the one asked for, or the best there is; 409 if none fits."""
        supported = self.strategies(session)
        if not supported:
            raise StrategyUnavailable(
                f"the {self.lifecycle.placement.name} placement keeps no kernel state: its "
                "kernels' files are not on the gateway's host"
            )
        if requested is None:
            return supported[0]
        if requested == "checkpoint":
            raise StrategyUnavailable(CHECKPOINT_UNAVAILABLE)
        if requested == "namespace" and session.secret_names:
            raise StrategyUnavailable(_holds_secrets(session, "ask for 'replay', or for none"))
        if requested not in supported:
            raise StrategyUnavailable(
                f"the {session.kernel_name} kernel cannot keep its state by {requested!r}; it "
                f"supports {', '.join(supported)}"
            )
        return requested

    def state_dir(self, session_id: str) -> Path:
        """Where a paused session's saved state lives: its directory, out of the sandbox."""
        return self.lifecycle.placement.session_dir(session_id) / STATE_DIR

    async def save(
        self,
        session: Session,
        strategy: str,
        timeout: float,
        target: Path | None = None,
        limit: int | None = None,
    ) -> SavedState:
        """Save the running kernel's state (it keeps running) to ``target``; raise if it cannot.

        ``target`` defaults to the session's state directory (a pause); a
        snapshot names its own. A namespace past ``limit`` bytes is not kept.
        """
        lost: list[dict[str, str]] = []
        count = session.executions
        if strategy == "namespace":
            target = target or self.state_dir(session.id) / STATE_FILE
            lost, count = await self._save_namespace(session, timeout, target, limit)
        return SavedState(strategy, lost, count, time.time())

    async def _save_namespace(
        self, session: Session, timeout: float, target: Path, limit: int | None
    ) -> tuple[list[dict[str, str]], int]:
        kernel = session.kernel
        exchange = self.lifecycle.placement.kernel_exchange(session.id)
        assert kernel is not None and exchange is not None
        inside, here = exchange
        code = _SAVE.format(path=f"{inside}/{_EXCHANGED}", limit=limit)
        try:
            text = await kernel.evaluate(code, "get_ipython().user_ns.pop('_sbx_saved')", timeout)
            report = json.loads(ast.literal_eval(text))
            lost = [
                {key: str(entry[key])[:300] for key in ("name", "type", "reason")}
                for entry in report["lost"][:_MAX_LOST]
            ]
            count = int(report["execution_count"])
        except (RuntimeError, TimeoutError, ValueError, SyntaxError, KeyError, TypeError) as e:
            raise StateNotSaved(
                f"the kernel could not save its namespace ({e}); the session keeps running: free "
                "some memory or disk, or ask for strategy 'replay'"
            ) from e
        try:
            await asyncio.to_thread(_take, here / _EXCHANGED, target)
            size = (await asyncio.to_thread(os.lstat, target)).st_size
        except OSError as e:
            raise StateNotSaved(f"the saved namespace could not be kept ({e})") from e
        if limit is not None and size > limit:  # the cap in the kernel is the sandbox's to lift
            await asyncio.to_thread(target.unlink)
            raise StateNotSaved(
                f"the kernel could not save its namespace (OverflowError: the namespace is "
                f"larger than {limit} bytes)"
            )
        return lost, count

    async def copy_paused(
        self, session: Session, requested: str | None, target: Path
    ) -> SavedState:
        """A paused session's saved state, copied to ``target`` (for a snapshot)."""
        assert session.paused is not None
        saved = SavedState.from_json(session.paused)
        if requested is not None and requested != saved.strategy:
            raise StrategyUnavailable(
                f"session {session.id} is paused with its state kept by {saved.strategy!r}; "
                f"resume it to take a snapshot by {requested!r}"
            )
        if saved.strategy == "namespace" and session.secret_names:  # paused before this rule
            raise StrategyUnavailable(_holds_secrets(session, "resume it, then take the snapshot"))
        if saved.strategy == "namespace":
            kept = self.state_dir(session.id) / STATE_FILE
            try:
                await asyncio.to_thread(_copy_regular, kept, target)
            except OSError as e:
                raise StateNotSaved(f"the paused session's state could not be copied ({e})") from e
        return saved

    async def load_pooled(self, session: Session, saved: SavedState, pooled: Session) -> None:
        """Load a paused session's saved namespace into a pooled kernel it is resuming in.

        Runs while the session's files are copied into the pooled sandbox;
        ``restore(..., loaded=True)`` then gives the rest. Nothing to do for replay.
        """
        if saved.strategy != "namespace":
            return
        exchange = self.lifecycle.placement.kernel_exchange(pooled.id)
        assert exchange is not None
        inside, here = exchange
        await self._hand_over(session, self.state_dir(session.id) / STATE_FILE, here)
        await self._load_namespace(pooled, f"{inside}/{_EXCHANGED}", saved.execution_count)

    async def _hand_over(self, session: Session, kept: Path, here: Path) -> None:
        try:
            await asyncio.to_thread(_hand_over, kept, here / _EXCHANGED)
        except OSError as e:
            raise StateNotRestored(
                f"the saved namespace of session {session.id} cannot be read ({e}); "
                "delete the session, or start a new one"
            ) from e

    async def restore(
        self,
        session: Session,
        saved: SavedState,
        start: Callable,
        kept: Path | None = None,
        loaded: bool = False,
        upto: int | None = None,
    ) -> dict:
        """Start a fresh kernel with ``start()`` and give it the saved state back.

        ``kept`` is where the state was saved (default: the session's state
        directory); ``loaded``: ``load_pooled`` gave the namespace already;
        ``upto``: replay the cells up to that execution count only.
        Returns what the caller reports: the strategy, and for replay the
        cells whose outputs differed. Raises ``StateNotRestored`` when the saved state
        cannot be read. The saved state is kept until ``forget``, so a gateway
        killed meanwhile finds the session paused with its state.
        """
        kept = kept or self.state_dir(session.id) / STATE_FILE
        namespace = saved.strategy == "namespace" and not loaded
        if namespace:
            exchange = self.lifecycle.placement.kernel_exchange(session.id)
            assert exchange is not None
            inside, here = exchange
            await self._hand_over(session, kept, here)
        await start()
        report: dict[str, Any] = {"strategy": saved.strategy, "lost": saved.lost}
        if namespace:
            await self._load_namespace(session, f"{inside}/{_EXCHANGED}", saved.execution_count)
        elif saved.strategy == "replay":
            report["differed"] = await self._replay(session, upto)
        return report

    async def forget(self, session: Session) -> None:
        """Remove a resumed session's saved state, once its record says it runs again.

        Its crash checkpoint stays, in the directory a resume in a pooled sandbox carries.
        """
        await asyncio.to_thread(_forget, self.state_dir(session.id))

    async def _load_namespace(self, session: Session, path: str, count: int) -> None:
        kernel = session.kernel
        assert kernel is not None
        code = _LOAD.format(path=path, count=count)
        try:
            await kernel.evaluate(code, "get_ipython().user_ns.pop('_sbx_loaded')", 300.0)
        except (RuntimeError, TimeoutError) as e:
            raise StateNotRestored(
                f"the saved namespace could not be loaded into the new kernel ({e}); it is kept: "
                "delete the session, or start a new one"
            ) from e

    async def _replay(self, session: Session, upto: int | None) -> list[dict[str, Any]]:
        """Run the recorded cells again (up to ``upto``); report those whose outputs differ."""
        kernel = session.kernel
        assert kernel is not None
        differed = []
        after: int | None = 0
        seen = 0  # executions as the session counts them (commands, denied cells too)
        while after is not None:
            page = await self.store.history(session.id, after, HISTORY_PAGE_MAX)
            for cell in page.executions:
                seen += 1
                if upto is not None and seen > upto:
                    return differed
                if not ran_in_kernel(cell):
                    continue
                result = await kernel.execute(
                    cell["code"],
                    timeout=session.limits.timeout,
                    cap=OutputCap(session.limits.output_bytes),
                    grace=self.grace,
                    mask=session.masker,
                )
                diff = await asyncio.to_thread(self.diff, cell["outputs"], result.outputs)
                if diff or result.status != cell["status"]:
                    differed.append(
                        {
                            "execution_count": cell["execution_count"],
                            "status": result.status,
                            "recorded_status": cell["status"],
                            "diff": diff,
                        }
                    )
            after = page.next
        return differed


def _holds_secrets(session: Session, then: str) -> str:
    """Why a session holding secrets keeps no saved namespace, and what to do instead."""
    return (
        f"session {session.id} holds sealed secrets ({', '.join(session.secret_names)}): a "
        "saved namespace would keep their values, and what was computed from them, in the "
        "clear on disk and in every fork, so its state is kept by 'replay' (its masked "
        f"history, run again); {then}"
    )


def _take(source: Path, target: Path) -> None:
    """Move a file the kernel wrote out of its reach; refuse anything but a regular file."""
    target.parent.mkdir(mode=0o700, exist_ok=True)
    try:
        os.rename(source, target)  # the sandbox keeps no handle on the name it wrote
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        _copy_regular(source, target)  # another filesystem: copied from a no-follow open
        os.unlink(source)
    if not stat.S_ISREG(os.lstat(target).st_mode):
        _remove(target)
        raise StateNotSaved("the kernel left something other than a file as its state")


def _remove(path: Path) -> None:
    """Remove what the kernel left, a tree of its making too, never following a link."""
    parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            remove_tree(parent, path.name)
        else:
            os.unlink(path.name, dir_fd=parent)
    finally:
        os.close(parent)


def _forget(state_dir: Path) -> None:
    """Remove what a pause kept, whatever it is, all but the crash checkpoint."""
    try:
        names = os.listdir(state_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name != CHECKPOINT_FILE:
            _remove(state_dir / name)


def _copy_regular(source: Path, target: Path) -> None:
    """Copy a regular file, never through a link, into a new file."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateNotSaved("the kernel left something other than a file as its state")
        out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _hand_over(kept: Path, exchanged: Path) -> None:
    """Put the kept state where the next kernel reads it, never through a planted link.

    A hard link where it can (no copy of a large namespace): the loading code
    removes it before any user code runs in that kernel. A copy otherwise.
    """
    exchanged.unlink(missing_ok=True)
    try:
        os.link(kept, exchanged, follow_symlinks=False)
    except OSError:  # another filesystem
        _copy_regular(kept, exchanged)
    os.chmod(exchanged, 0o644, follow_symlinks=False)  # the kernel's user reads it
