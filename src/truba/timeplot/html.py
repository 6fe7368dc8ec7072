"""A timeline as one self-contained HTML page: data, script and style inline, nothing fetched.

The page embeds the spans as JSON (``<script type="application/json" id="timeline-data">``) and
the dashboard's ``timeline.js``, which draws them as SVG with hover, zoom and pan.
"""

from __future__ import annotations

import html
import importlib.resources
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from truba.timeplot.model import Span

_PAGE: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font: 13px/1.4 system-ui, sans-serif; margin: 1em 1.5em; color: #1d2430; }}
h1 {{ font-size: 1.2em; margin: 0 0 .3em; }}
p {{ color: #6b7585; margin: 0 0 1em; }}
svg {{ width: 100%; display: block; cursor: grab; user-select: none; }}
svg text {{ fill: #6b7585; font-size: 10px; }}
svg .tl-lane {{ fill: #1d2430; }}
svg .tl-grid {{ stroke: #e3e7ee; }}
svg .tl-stripe {{ fill: #f4f6fa; }}
svg .tl-span:hover {{ opacity: .7; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>{summary} · hover a bar for its task; the wheel zooms, dragging pans, a double click resets.</p>
<svg id="timeline"></svg>
<script type="application/json" id="timeline-data">{data}</script>
<script>
{script}
</script>
<script>
(function () {{
  const spans = JSON.parse(document.getElementById("timeline-data").textContent);
  const svg = document.getElementById("timeline");
  const draw = () => drawTimeline(svg, spans);
  draw();
  window.addEventListener("resize", draw);
}})();
</script>
</body>
</html>
"""


def _script() -> str:
    return (importlib.resources.files("truba.scheduler") / "static" / "timeline.js").read_text()


def render_html(spans: Sequence[Span], title: str, summary: str) -> str:
    """The page's text."""
    data = json.dumps([s.to_json() for s in spans], separators=(",", ":"))
    return _PAGE.format(
        title=html.escape(title),
        summary=html.escape(summary),
        data=data.replace("</", "<\\/"),  # never ends the script element early
        script=_script(),
    )


def write_html(path: Path, spans: Sequence[Span], title: str, summary: str) -> None:
    """Writes the page to ``path``."""
    path.write_text(render_html(spans, title, summary), encoding="utf-8")
