"""E2B's ``Template`` builder over the tenant's templates (``/v1/templates``).

The stock SDK asks for a build (``POST /v3/templates``: the template's id is
its name here), uploads each ``copy()``'s files to the URL it is handed (back
to this edge, with the caller's own key as the header the SDK is told to
send), starts the build with its steps (``POST /v2/templates/{id}/builds/{build}``)
and polls its status and log. The steps become a Dockerfile: ``from_image``
and ``from_dockerfile``'s ``FROM`` name a local base (E2B's own base is the
Python image), ``from_template`` one of the tenant's templates, each COPY
reads its uploaded set (a directory named by its hash in the context), and
E2B's ``user`` is the sandbox's user. The Dockerfile then takes the same
path as ``/v1``'s: read strictly, built without network, hardened. A start
or ready command is refused: a sandbox here runs a kernel, not a command.
Tags (``name:tag``, ``tags=``) wait with the build's request and are the
version's once it is ready; ``assign_tags``, ``remove_tags`` and ``get_tags``
move, remove and list them (``sessions/templates.py``).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import tornado.web

from ...errors import BadRequest, Conflict
from ...sandbox.wheels import parse_pip
from ...sessions.template_files import UPLOAD_TIME
from ...sessions.templates import DEFAULT_TAG, template_name
from ..files import StreamedUpload
from .control import ControlHandler

_TEMPLATE = r"(?P<template_id>[^/]+)"
_BUILD = r"(?P<build_id>[0-9a-f]{32})"
DEFAULT_BASE = "e2bdev/base"  # what Template().from_base_image() names
USERS = {"user": "1000:1000"}  # E2B's default user is the sandbox's here
STATUS = {"building": "building", "ready": "ready", "failed": "error"}


def dockerfile_of(body: dict[str, Any]) -> tuple[str, list[str]]:
    """A ``TemplateBuildStartV2`` as a Dockerfile, and the file sets its COPY steps read."""
    if body.get("startCmd") or body.get("readyCmd"):
        raise BadRequest(
            "start and ready commands are not supported: a sandbox here runs a kernel; "
            "start the process from the sandbox (sandbox.commands.run) instead"
        )
    base = body.get("fromTemplate") or body.get("fromImage") or DEFAULT_BASE
    lines, hashes, user = [f"FROM {_word(base, 'the base')}"], [], ""
    steps = body.get("steps") or []
    if not isinstance(steps, list):
        raise BadRequest("steps must be a list")
    for step in steps:
        if not isinstance(step, dict):
            raise BadRequest("each step must be an object")
        kind, args = step.get("type"), [str(a) for a in step.get("args") or []]
        if kind == "RUN" and args:
            run = _pip_directive(args[0]) or f"RUN {json.dumps(['/bin/sh', '-c', args[0]])}"
            as_user = args[1] if len(args) > 1 and args[1] else ""
            lines += _as(as_user, run, user) if as_user else [run]
        elif kind == "COPY" and len(args) >= 2:
            files_hash = str(step.get("filesHash") or "")
            hashes.append(files_hash)
            src, dest, owner, mode = [*args, "", ""][:4]
            chown = f"--chown={_user(owner)} " if owner else ""
            paths = [f"{files_hash}/{_word(src, 'src')}", _word(dest, "dest")]
            lines.append(f"COPY {chown}{json.dumps(paths)}")
            if mode:
                lines += _as(
                    "root", f"RUN {json.dumps(['chmod', _word(mode, 'mode'), dest])}", user
                )
        elif kind == "ENV" and args and len(args) % 2 == 0:
            pairs = zip(args[::2], args[1::2], strict=True)
            lines.append(
                "ENV " + " ".join(f"{_word(k, 'a name')}={json.dumps(v)}" for k, v in pairs)
            )
        elif kind == "WORKDIR" and args:
            lines.append(f"WORKDIR {_word(args[0], 'the workdir')}")
        elif kind == "USER" and args:
            user = args[0]
            lines.append(f"USER {_user(user)}")
        else:
            raise BadRequest(f"step {kind!r} with {len(args)} arguments is not supported here")
    return "\n".join(lines) + "\n", hashes


def _pip_directive(command: str) -> str | None:
    """``pip_install``'s command as the Dockerfile line whose wheels the gateway fetches."""
    words = command.split(maxsplit=2)
    if words[:2] != ["pip", "install"]:
        return None
    return parse_pip(words[2] if len(words) > 2 else "").line


def _as(who: str, line: str, user: str) -> list[str]:
    """``line`` run as ``who``, then back to the template's user."""
    return [f"USER {_user(who)}", line, f"USER {_user(user or 'user')}"]


def _word(value: str, what: str) -> str:
    """One line's worth of a step: no line breaks (each would start an instruction)."""
    if not value or "\n" in value or "\r" in value or "\x00" in value:
        raise BadRequest(f"{what} must be one line of text")
    return value


def _user(name: str) -> str:
    return USERS.get(name, _word(name, "the user"))


def build_status(doc: dict[str, Any], build_id: str, offset: int) -> dict[str, Any]:
    """A build as E2B's ``TemplateBuildInfo``: its log from ``offset``, why it failed."""
    now = datetime.datetime.now(datetime.UTC).isoformat()
    lines = list(doc.get("logs", ()))[offset:]
    shown: dict[str, Any] = {
        "templateID": doc["name"],
        "buildID": build_id,
        "status": STATUS[doc["status"]],
        "logs": lines,
        "logEntries": [{"timestamp": now, "level": "info", "message": line} for line in lines],
    }
    if doc.get("error"):
        error = doc["error"]
        shown["reason"] = {"message": f"{error['step'] or 'build'}: {error['reason']}"}
    return shown


class TemplateRequestHandler(ControlHandler):
    """``POST /v3/templates``: a build's ids, before its files and steps come."""

    async def post(self) -> None:
        body = self.json_body()
        name, build_id, tags = self.templates.request_build(
            self.principal.tenant, body.get("name") or body.get("alias"), body.get("tags") or []
        )
        self.send(
            {
                "templateID": name,
                "buildID": build_id,
                "public": False,
                "names": [name],
                "aliases": [name],
                "tags": list(tags) or [DEFAULT_TAG],
            },
            status=202,
        )


@tornado.web.stream_request_body
class TemplateFilesHandler(StreamedUpload, ControlHandler):
    """A COPY's file set: whether it is here and where to upload it (GET), the upload (PUT,
    streamed to disk)."""

    actions = {"PUT": "template.build"}
    forwards = False
    disk = "the gateway's disk (retry later)"

    async def start_upload(self) -> None:
        declared = self.request.headers.get("Content-Length")
        self.upload = await self.templates.open_upload(
            self.principal.tenant,
            self.path_kwargs["template_id"],
            self.path_kwargs["files_hash"],
            int(declared) if declared else None,
        )
        self.request.connection.set_max_body_size(self.upload.room)
        self.request.connection.set_body_timeout(UPLOAD_TIME)  # then closed: the set goes

    def check_upload(self, size: int) -> None:
        """Its size is bounded as it streams in (``room``)."""

    async def get(self, template_id: str, files_hash: str) -> None:
        tenant = self.principal.tenant
        present = self.templates.uploaded(tenant, template_name(template_id), files_hash)
        url = f"{self.request.protocol}://{self.request.host}{self.request.path}"
        key = self.request.headers.get("X-API-Key")
        bearer = self.request.headers.get("Authorization", "")
        headers = {"X-API-Key": key} if key else {"Authorization": bearer}
        link = {} if present else {"url": url, "headers": headers}
        self.send({"present": present, **link}, status=201)  # E2B's API answers 201

    async def put(self, template_id: str, files_hash: str) -> None:
        self.answer_refusal()
        await self.finish_upload()
        self.set_status(201)
        self.finish()


class TemplateBuildHandler(ControlHandler):
    """``POST /v2/templates/{id}/builds/{build}``: the steps, built."""

    actions = {"POST": "template.build"}

    async def post(self, template_id: str, build_id: str) -> None:
        body = self.json_body()
        dockerfile, hashes = dockerfile_of(body)
        doc = await self.templates.build_uploaded(
            self.principal.tenant, template_name(template_id), dockerfile, hashes, build_id
        )
        self.audit_detail.update(template=doc["name"], version=doc["version"])
        self.set_status(202)
        self.finish()


class TemplateBuildStatusHandler(ControlHandler):
    async def get(self, template_id: str, build_id: str) -> None:
        offset = self.get_query_argument("logsOffset", "0")
        if not offset.isdigit():
            raise BadRequest("logsOffset must be a number of log lines")
        doc = await self.templates.build_of(self.principal.tenant, template_id, build_id)
        self.send(build_status(doc, build_id, int(offset)))


class TemplateAliasHandler(ControlHandler):
    """``Template.exists(name)``: the tenant's template by name, or ``name:tag`` (another
    tenant's is a 404); one still building exists."""

    async def get(self, alias: str) -> None:
        try:
            await self.templates.resolve(self.principal.tenant, alias)
        except Conflict:
            pass
        self.send({"templateID": alias.partition(":")[0], "public": False})


def _iso(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).isoformat()


class TemplateTagsHandler(ControlHandler):
    """``Template.assign_tags`` (``POST``: a target ``name:tag`` or ``name:version``, its
    tags moved to that version) and ``Template.remove_tags`` (``DELETE``)."""

    actions = {"POST": "template.tag", "DELETE": "template.untag"}

    async def post(self) -> None:
        body = self.json_body()
        doc, tags = await self.templates.assign(
            self.principal.tenant, body.get("target"), body.get("tags")
        )
        self.audit_detail.update(template=doc["name"], version=doc["version"], tags=list(tags))
        self.send({"tags": list(tags), "buildID": doc.get("build_id", doc["id"])}, status=201)

    async def delete(self) -> None:
        body = self.json_body()
        name = template_name(body.get("name"))
        self.audit_detail.update(template=name)
        await self.templates.remove(self.principal.tenant, name, body.get("tags"))
        self.set_status(204)
        self.finish()


class TemplateTagListHandler(ControlHandler):
    """``Template.get_tags(name)``: its tags, each with its build and when it was assigned."""

    async def get(self, template_id: str) -> None:
        rows = await self.templates.tags(self.principal.tenant, template_id)
        self.send(
            [
                {"tag": r["tag"], "buildID": r["build_id"], "createdAt": _iso(r["created_at"])}
                for r in rows
            ]
        )


routes = [
    (r"/v3/templates", TemplateRequestHandler),
    (r"/templates/tags", TemplateTagsHandler),  # (these come before control's /templates/ID)
    (rf"/templates/{_TEMPLATE}/tags", TemplateTagListHandler),
    (r"/templates/aliases/(?P<alias>[^/]+)", TemplateAliasHandler),
    (rf"/templates/{_TEMPLATE}/files/(?P<files_hash>[0-9a-f]{{64}})", TemplateFilesHandler),
    (rf"/v2/templates/{_TEMPLATE}/builds/{_BUILD}", TemplateBuildHandler),
    (rf"/templates/{_TEMPLATE}/builds/{_BUILD}/status", TemplateBuildStatusHandler),
]
