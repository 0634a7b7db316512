"""``sbx replay --report report.html``: a replay as a page, recorded and replayed side by side.

One self-contained HTML file (images inline as data URLs, no script): each
code cell with its verdict, its source, what was recorded beside what the
replay produced, and the diff where they differ. Outputs came out of a
sandbox, so HTML outputs are shown in sandboxed iframes (no scripts, no
same origin) and everything else is escaped text.
"""

from __future__ import annotations

import html
from typing import Any

from ..client import ReplayReport
from ..client.models import IMAGE_TYPES, join_text, strip_ansi

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #1f2328; }
h1 { font-size: 20px; margin: 0 0 4px; }
.summary { margin-bottom: 16px; }
.verdict { font-weight: 600; padding: 2px 8px; border-radius: 10px; }
.reproduced { background: #dafbe1; color: #116329; }
.failed { background: #ffebe9; color: #a40e26; }
.warning { background: #fff8c5; padding: 6px 10px; margin: 4px 0; border-radius: 6px; }
.cell { border: 1px solid #d0d7de; border-radius: 8px; margin: 14px 0; overflow: hidden; }
.cell > header { display: flex; gap: 12px; align-items: center; padding: 6px 12px;
  background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
.badge { font-weight: 600; padding: 1px 8px; border-radius: 10px; font-size: 12px; }
.same .badge { background: #dafbe1; color: #116329; }
.different .badge { background: #fff1e5; color: #953800; }
.error .badge { background: #ffebe9; color: #a40e26; }
.skipped .badge { background: #eaeef2; color: #57606a; }
pre { margin: 0; white-space: pre-wrap; word-break: break-word; font: 12.5px/1.4 ui-monospace,
  SFMono-Regular, Menlo, monospace; }
.source { padding: 8px 12px; background: #fbfcfd; border-bottom: 1px solid #d0d7de; }
.sides { display: grid; grid-template-columns: 1fr 1fr; }
.side { padding: 8px 12px; min-width: 0; }
.side + .side { border-left: 1px solid #d0d7de; }
.side h3 { font-size: 12px; text-transform: uppercase; color: #57606a; margin: 0 0 6px; }
.side img { max-width: 100%; }
.side iframe { width: 100%; border: 1px solid #eaeef2; min-height: 120px; }
.stderr { color: #a40e26; }
.diff { padding: 8px 12px; border-top: 1px solid #d0d7de; background: #fffbf0; }
.add { color: #116329; } .del { color: #a40e26; }
"""


def render_report(source: str, recorded: dict[str, Any], report: ReplayReport) -> str:
    """The page for a replay of ``recorded`` (the notebook as given)."""
    replayed = report.notebook.get("cells", [])
    verdict = "reproduced" if report.reproduced else "did not reproduce"
    counts = ", ".join(f"{n} {kind}" for kind, n in report.summary.items())
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>Replay of {_e(source)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Replay of {_e(source)}</h1>",
        "<div class='summary'><span class='verdict "
        f"{'reproduced' if report.reproduced else 'failed'}'>{verdict}</span> {_e(counts)}",
        f" · image {_e(report.image or '-')}",
        f" · inputs: {_e(', '.join(report.inputs) or 'none')}</div>",
        *(f"<div class='warning'>{_e(w)}</div>" for w in report.warnings),
    ]
    cells = recorded.get("cells", [])
    for cell in report.cells:
        before = cells[cell.index] if cell.index < len(cells) else {}
        after = replayed[cell.index] if cell.index < len(replayed) else {}
        parts.append(
            f"<section class='cell {_e(cell.result)}' data-index='{cell.index}'>"
            f"<header><span class='badge'>{_e(cell.result)}</span>"
            f"<span>cell {cell.index}</span><code>{_e(cell.cell_id or '')}</code>"
            f"<span>{_e(cell.recorded_status or '')} → {_e(cell.status or '')}</span></header>"
            f"<div class='source'><pre>{_e(join_text(before.get('source', '')))}</pre></div>"
            "<div class='sides'>"
            f"<div class='side recorded'><h3>recorded</h3>{_outputs(before)}</div>"
            f"<div class='side replayed'><h3>replayed</h3>{_outputs(after)}</div>"
            "</div>"
        )
        if cell.diff and cell.result != "same":
            parts.append(f"<div class='diff'><pre>{_diff(cell.diff)}</pre></div>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "".join(parts)


def _e(text: str) -> str:
    return html.escape(str(text), quote=True)


def _outputs(cell: dict[str, Any]) -> str:
    shown = [_output(o) for o in cell.get("outputs", [])]
    return "".join(shown) or "<pre><i>no output</i></pre>"


def _output(output: dict[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        name = "stderr" if output.get("name") == "stderr" else "stdout"
        return f"<pre class='{name}'>{_e(strip_ansi(join_text(output.get('text', ''))))}</pre>"
    if kind == "error":
        trace = strip_ansi("\n".join(output.get("traceback") or []))
        text = trace or f"{output.get('ename')}: {output.get('evalue')}"
        return f"<pre class='stderr'>{_e(text)}</pre>"
    data = output.get("data") or {}
    for mime in IMAGE_TYPES:
        if mime in data:
            encoded = "".join(join_text(data[mime]).split())
            return f"<img alt='{_e(mime)}' src='data:{mime};base64,{_e(encoded)}'>"
    if "text/html" in data:  # untrusted markup: a sandboxed frame, no scripts, no origin
        return f"<iframe sandbox srcdoc='{_e(join_text(data['text/html']))}'></iframe>"
    if "text/plain" in data:
        return f"<pre>{_e(strip_ansi(join_text(data['text/plain'])))}</pre>"
    return f"<pre><i>{_e(', '.join(data) or kind or 'output')}</i></pre>"


def _diff(diff: str) -> str:
    lines = []
    for line in diff.splitlines():
        css = "add" if line.startswith("+") else "del" if line.startswith("-") else ""
        lines.append(f"<span class='{css}'>{_e(line)}</span>" if css else _e(line))
    return "\n".join(lines)
