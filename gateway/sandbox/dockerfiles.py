"""A tenant's Dockerfile, read strictly before the engine sees it.

A template is built on this host with no registry, so every ``FROM`` must
name a base the host holds; the builder rewrites each to that image's id so
nothing is ever pulled. The builder runs on the daemon's side, so what a
Dockerfile could make the daemon itself fetch or read is refused: ``ADD``
of a URL (fetched from the host's network, which reaches the gateway's
ports) or of a source the daemon puts together (variables, quotes,
escapes), ``COPY --from=`` an image (another tenant's template, say) rather
than an earlier stage, ``ONBUILD`` (a trigger for someone else's build), and
variables in ``FROM``. Pure: no engine, no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

from ..errors import BadRequest
from .wheels import DIRECTIVE, parse_pip

MAX_DOCKERFILE = 256 * 1024
_FLAG = re.compile(r"--([a-z-]+)(?:=(\S*))?")
_URL = re.compile(r"[a-z][a-z0-9+.-]*://|git@", re.I)  # anywhere: JSON and words may differ
_ASSEMBLED = re.compile(r"[$\\\"':]")  # what the engine reads a word's pieces by
_STAGE = re.compile(r"[a-zA-Z][a-zA-Z0-9_.-]{0,62}")
# Instructions whose effect lands outside the tenant's own build step: why each goes.
_REFUSED = {
    "ONBUILD": "a trigger would run in the gateway's own layer and in later builds",
    "VOLUME": "a volume is writable past the sandbox's read-only root and disk bounds; "
    "write to /workspace or /tmp",
    "HEALTHCHECK": "the daemon would run it in every sandbox of the template; leave it out",
    "STOPSIGNAL": "a sandbox stops on SIGTERM, as the gateway's teardown expects",
}
# Labels the gateway finds its own containers by; a sandbox inherits its image's labels.
OWN_LABELS = "sbx."
PIP = DIRECTIVE  # the keyword of a '# sbx: pip install' line: no written instruction's


class DockerfileRefused(BadRequest):
    """A Dockerfile this host will not build, with the line and what to do instead."""

    code = "dockerfile_refused"


@dataclasses.dataclass(frozen=True)
class Instruction:
    line: int  # 1-based, where the instruction starts
    keyword: str  # upper case
    text: str  # the arguments, continuation lines joined


def instructions(source: str) -> list[Instruction]:
    """The instructions of a Dockerfile, comments and blank lines dropped, continuations joined.

    A ``# sbx: pip install`` line is kept, as the instruction ``PIP`` (``wheels``).
    """
    try:
        size = len(source.encode())
    except UnicodeEncodeError:  # a lone surrogate, as JSON's "\ud800" gives
        raise DockerfileRefused("the Dockerfile is not valid text; send it as UTF-8") from None
    if size > MAX_DOCKERFILE:
        raise DockerfileRefused(f"the Dockerfile is larger than {MAX_DOCKERFILE // 1024} KiB")
    if "\x00" in source:
        raise DockerfileRefused("the Dockerfile holds a NUL byte; send it as UTF-8 text")
    lines = source.splitlines()
    found, i = [], 0
    while i < len(lines):
        text = lines[i].strip()
        if text == DIRECTIVE or text.startswith(DIRECTIVE + " "):
            found.append(Instruction(i + 1, PIP, text[len(DIRECTIVE) :].strip()))
        if not lines[i].strip() or lines[i].lstrip().startswith("#"):
            i += 1
            continue
        start, parts = i + 1, []
        while i < len(lines):
            line = lines[i].rstrip()
            i += 1
            if not line.endswith("\\"):
                parts.append(line)
                break
            parts.append(line[:-1])
            while i < len(lines) and lines[i].lstrip().startswith("#"):
                i += 1  # a comment inside a continued instruction
        # Split on any blank, as the engine does (a tab after the keyword is one).
        keyword, text = [*" ".join(p.strip() for p in parts).split(maxsplit=1), "", ""][:2]
        found.append(Instruction(start, keyword.upper(), text.strip()))
    return found


def resolve(source: str, base_of: Callable[[str], str | None], bases: list[str]) -> tuple[str, str]:
    """The Dockerfile with every ``FROM`` naming a local image, and its last stage's base.

    ``base_of`` maps a name the tenant may build from to an image (None: not
    one); ``bases`` lists those names for the error. The base returned is
    the name as written, an earlier stage followed back to its own.
    """
    stages: dict[str, str] = {}  # stage -> the base it starts from, as written
    last = ""
    out: list[str] = []
    seen_from = False
    for ins in instructions(source):
        where = f"line {ins.line}"
        if f"{ins.keyword} {ins.text}".rstrip().endswith("\\"):  # the engine would continue it
            raise DockerfileRefused(
                f"{where}: {ins.keyword} ends in a backslash continued into nothing (a blank "
                "line or the end of the file); end the instruction without it"
            )
        if ins.keyword == "FROM":
            seen_from = True
            line, last = _from(ins, where, stages, base_of, bases)
            out.append(f"FROM {line}")
            continue
        if ins.keyword == "ARG" and not seen_from:
            raise DockerfileRefused(
                f"{where}: ARG before FROM: a base is named directly here ({', '.join(bases)})"
            )
        if not seen_from:
            raise DockerfileRefused(f"{where}: {ins.keyword} before the first FROM")
        if ins.keyword in _REFUSED:
            raise DockerfileRefused(
                f"{where}: {ins.keyword} is not supported in templates ({_REFUSED[ins.keyword]})"
            )
        if ins.keyword == "LABEL" and "$" in ins.text:
            raise DockerfileRefused(
                f"{where}: LABEL takes no variables here (a key could become the gateway's "
                f"own, {OWN_LABELS!r}); write its keys and values out"
            )
        # The engine joins a word's quoted and escaped pieces: s\bx. and "sbx". are sbx.
        if ins.keyword == "LABEL" and OWN_LABELS in _unquoted(ins.text).lower():
            raise DockerfileRefused(
                f"{where}: LABEL is not supported in templates with a key or value naming "
                f"{OWN_LABELS!r} (the gateway's own labels); name yours otherwise"
            )
        if ins.keyword in ("ADD", "COPY"):
            _copy(ins, where, stages)
        if ins.keyword == PIP:
            try:
                out.append(parse_pip(ins.text).line)
            except BadRequest as e:
                raise DockerfileRefused(f"{where}: {e}") from None
            continue
        if ins.keyword == "RUN" and _flags(ins.text)[0]:
            raise DockerfileRefused(f"{where}: RUN takes no flags here (--mount, --network)")
        out.append(f"{ins.keyword} {ins.text}")
    if not seen_from:
        raise DockerfileRefused(
            f"the Dockerfile has no FROM; build from one of: {', '.join(bases)}"
        )
    return "\n".join(out) + "\n", last


def _flags(text: str) -> tuple[dict[str, str], str]:
    """Leading ``--name[=value]`` flags of an instruction, and the rest."""
    flags: dict[str, str] = {}
    rest = text
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        match = _FLAG.fullmatch(word)
        if match is None:
            raise DockerfileRefused(f"unreadable flag {word[:40]!r}")
        flags[match.group(1)] = match.group(2) or ""
        rest = rest.lstrip()
    return flags, rest


def _from(
    ins: Instruction,
    where: str,
    stages: dict[str, str],
    base_of: Callable[[str], str | None],
    bases: list[str],
) -> tuple[str, str]:
    flags, rest = _flags(ins.text)
    if flags:
        raise DockerfileRefused(f"{where}: FROM takes no flags here ({', '.join(flags)})")
    words = rest.split()
    if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
        raise DockerfileRefused(f"{where}: write FROM <base> [AS <stage>]")
    name = words[0]
    if "$" in name:
        raise DockerfileRefused(
            f"{where}: FROM takes no variables; name one of: {', '.join(bases)}"
        )
    if name in stages and not name.isdigit():  # the engine's FROM knows stages by name only
        image, root = name, stages[name]
    else:
        root = name
        image = base_of(name) or ""
        if not image:
            raise DockerfileRefused(
                f"{where}: no base {name[:200]!r} on this host, and nothing is pulled here "
                f"(there is no registry); build from one of: {', '.join(bases)}"
            )
    if len(words) == 3:
        if not _STAGE.fullmatch(words[2]):
            raise DockerfileRefused(f"{where}: stage name {words[2][:64]!r} is not a plain name")
        if words[2].lower() in (s.lower() for s in stages):
            raise DockerfileRefused(f"{where}: stage name {words[2]!r} is used twice")
        stages[words[2]] = root
        return f"{image} AS {words[2]}", root
    stages[str(len(stages))] = root
    return image, root


def _copy(ins: Instruction, where: str, stages: dict[str, str]) -> None:
    flags, rest = _flags(ins.text)
    unknown = set(flags) - {"from", "chown", "chmod"}
    if unknown:
        raise DockerfileRefused(
            f"{where}: {ins.keyword} flag --{sorted(unknown)[0]} is not supported"
        )
    source = flags.get("from")
    # The stage being built is not the engine's yet: its name would be looked up as an image.
    if source is not None and source not in list(stages)[:-1]:
        raise DockerfileRefused(
            f"{where}: {ins.keyword} --from must name an earlier stage of this Dockerfile "
            f"({', '.join(s for s in list(stages)[:-1] if not s.isdigit()) or 'none'}), "
            "not an image nor the stage it is in"
        )
    if ins.keyword != "ADD":
        return
    url = _URL.search(rest)  # first: a form refused as unreadable may name one too
    sources = [] if url else _sources(rest)
    if url or any(_URL.search(s) for s in sources):
        raise DockerfileRefused(
            f"{where}: ADD of a URL is not supported (the build has no network); put the file "
            "in the build context and COPY it"
        )
    # The engine puts a source's word together (variables, quotes, escapes) before it looks
    # for a URL in it: so what it might make one of is refused too.
    if any(_ASSEMBLED.search(s) for s in sources):
        raise DockerfileRefused(
            f"{where}: ADD takes plain paths of the build context here (no variable, quote, "
            "escape or colon in its sources); put the file in the context and COPY it"
        )


def _sources(rest: str) -> list[str]:
    if rest.startswith("["):
        try:  # NaN and Infinity too: the engine reads a form it cannot parse as words
            words = json.loads(rest, parse_constant=_no_constant)
        except ValueError:
            raise DockerfileRefused(f"unreadable JSON form {rest[:80]!r}") from None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise DockerfileRefused(f"the JSON form {rest[:80]!r} must be a list of strings")
        return words[:-1]
    return rest.split()[:-1]


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON the engine reads")


def _unquoted(text: str) -> str:
    """A LABEL's text without the quotes and escapes the engine drops from its words."""
    return re.sub(r"[\\\"']", "", text)
