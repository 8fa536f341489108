"""`render_page`: the report as one self-contained HTML page (no script, no stylesheet or font from elsewhere).

Each plot is embedded as a base64 `data:` URI, so the page alone can be mailed or archived, and links to its PNG
next to it. Every text that came from the run directory (run id, peer names, warnings) is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; } td { padding: 0.25em 1em 0.25em 0; vertical-align: top; }
td:first-child { color: #555; white-space: nowrap; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
figcaption, .note { color: #666; font-size: 0.9em; } .warn { color: #a05a00; }
"""


def render_page(title: str, summary: Sequence[tuple[str, str]], plots: Sequence[tuple[str, Path]],
                notes: Sequence[str] = (), warnings: Sequence[str] = ()) -> str:
    """The page's HTML.

    :param summary: (label, value) rows of the summary table
    :param plots: (caption, PNG path) of each plot, embedded in this order
    :param notes: why a plot is missing, and similar
    :param warnings: what was skipped while reading the run directory
    """
    e = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>{e(title)}</h1>", "<h2>Summary</h2><table>"]
    parts += [f"<tr><td>{e(label)}</td><td>{e(value)}</td></tr>" for label, value in summary]
    parts.append("</table>")
    for caption, path in plots:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<h2>{e(caption)}</h2><figure><a href='{e(path.name)}'>"
                     f"<img src='data:image/png;base64,{data}' alt='{e(path.name)}'></a>"
                     f"<figcaption>{e(path.name)}</figcaption></figure>")
    if notes:
        parts.append("<h2>Not shown</h2><ul>" + "".join(f"<li class='note'>{e(n)}</li>" for n in notes) + "</ul>")
    if warnings:
        parts.append("<h2>Skipped while reading</h2><ul>" +
                     "".join(f"<li class='warn'>{e(w)}</li>" for w in warnings) + "</ul>")
    parts.append("</body></html>\n")
    return "\n".join(parts)
