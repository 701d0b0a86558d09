"""The compile report: one self-contained HTML page of everything kiln compiled in a process.

`KILN_REPORT=<dir>` (config.report) turns it on when kiln is imported: `enable()` starts
recording and the page is written into that folder when the process exits
(`kiln_report_<time>_<pid>.html`). `kiln report [--out DIR] -- python script.py` (`main`) runs a
script that way and prints where its page is. `write(path)` writes the page now.

What it records, only while on (off, the compile path does no extra work):
- each frame kiln's frontend traces (a wrapper around `Dispatcher._capture`): its function,
  why it was traced again (the failing guards of the entries it already had), its guard
  function, the FX graph it captured and the code that runs it, or why it runs eagerly;
- each graph break (the frontend's `break_listeners`), with its reason and source line;
- each ATen graph the backend compiles (`GraphDump.observer`: the dump keeps the text of every
  stage it is handed: ATen graph, LoopIR before and after fusion and after each pass, memory
  plan, kernels, wrapper, the fallback's traceback) and its stage timings;
- every warning on kiln's logger (fallbacks, eager frames, recompile limits), read by a filter
  that lets each record through unchanged.

The page is plain HTML with inline CSS and a few lines of inline JavaScript (expand or
collapse all; following a link opens the section it points to); it loads nothing. Every text
shown goes through `html.escape`.
"""
from __future__ import annotations

import argparse
import atexit
import datetime
import html
import linecache
import logging
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from kiln.config import OPTIONS, config
from kiln.debug.dump import GraphDump


@dataclass
class BreakRecord:
    index: int
    reason: str
    location: str  # file:line in function
    frame_name: str  # the compiled function whose entry breaks there
    frame: "FrameRecord | None"

    @property
    def anchor(self) -> str:
        return f"break_{self.index}"

    @property
    def source_line(self) -> str:
        match = re.match(r"(.*):(\d+) in ", self.location)
        return linecache.getline(match.group(1), int(match.group(2))).strip() if match else ""


@dataclass
class GraphRecord:
    dump: GraphDump
    aten_nodes: int
    kind: str  # forward (or inference), backward
    frame: "FrameRecord | None"

    @property
    def anchor(self) -> str:
        return self.dump.name

    @property
    def texts(self) -> dict:
        return self.dump.kept or {}

    @property
    def kernels(self) -> list:
        """[(name, filename, source)] of the graph's kernels, in the order the backend wrote them."""
        return [(re.sub(r"^kernel_|\.\w+$", "", filename), filename, text)
                for filename, text in self.texts.items() if filename.startswith("kernel_")]

    @property
    def fallback(self) -> str | None:
        return self.texts.get("fallback.txt")

    @property
    def status(self) -> str:
        if self.fallback is not None:
            return "runs eagerly"
        return "compiled" if "wrapper.py" in self.texts else "compiling"

    @property
    def seconds(self) -> float:
        return sum(self.dump.timings.values())


@dataclass
class FrameRecord:
    index: int
    name: str
    recompile_reasons: list  # why the entries it had did not match; empty: its first trace
    graphs: list = field(default_factory=list)  # GraphRecord compiled while it was traced
    breaks: list = field(default_factory=list)  # BreakRecord
    guard_source: str = ""
    entry_source: str = ""
    fx_graph: str | None = None
    eager_reason: str | None = None
    error: str | None = None  # what the trace raised (strict mode, fullgraph=True)
    seconds: float = 0.0

    @property
    def anchor(self) -> str:
        return f"frame_{self.index}"

    @property
    def status(self) -> str:
        if self.error is not None:
            return "raised"
        if self.eager_reason is not None:
            return "runs eagerly"
        return "graph break" if self.breaks else "captured"


class Recorder:
    """What the report shows, recorded as kiln compiles."""

    def __init__(self) -> None:
        self.started = time.time()
        self.frames: list[FrameRecord] = []
        self.graphs: list[GraphRecord] = []
        self.breaks: list[BreakRecord] = []
        self.warnings: list[str] = []
        self._local = threading.local()  # .tracing: this thread's frames being traced now, innermost last

    @property
    def _tracing(self) -> list:
        if not hasattr(self._local, "tracing"):
            self._local.tracing = []
        return self._local.tracing

    def current_frame(self) -> FrameRecord | None:
        return self._tracing[-1] if self._tracing else None

    def on_graph(self, dump: GraphDump, gm) -> None:
        dump.kept = {}
        nodes = list(gm.graph.nodes) if gm is not None else []
        backward = any(node.op == "placeholder" and node.name.startswith("tangents") for node in nodes)
        record = GraphRecord(dump, sum(1 for node in nodes if node.op == "call_function"),
                             "backward" if backward else "forward", self.current_frame())
        self.graphs.append(record)
        if record.frame is not None:
            record.frame.graphs.append(record)

    def on_break(self, graph_break) -> None:
        record = BreakRecord(len(self.breaks), graph_break.reason, graph_break.location, graph_break.frame,
                             self.current_frame())
        self.breaks.append(record)
        if record.frame is not None:
            record.frame.breaks.append(record)

    def filter(self, record: logging.LogRecord) -> bool:
        """A logging filter on kiln's logger: keeps each warning's text, lets every record through."""
        if record.levelno >= logging.WARNING:
            self.warnings.append(record.getMessage())
        return True

    def capturing(self, original):
        """`Dispatcher._capture` wrapped: each trace of a frame becomes a FrameRecord."""
        recorder = self

        def _capture(dispatcher, args, kwargs):
            reasons = dispatcher._failure_reasons(args, kwargs) if dispatcher.entries else []
            frame = FrameRecord(len(recorder.frames), dispatcher._name(), reasons)
            recorder.frames.append(frame)
            recorder._tracing.append(frame)
            start = time.perf_counter()
            try:
                entry = original(dispatcher, args, kwargs)
            except BaseException as error:
                frame.error = f"{type(error).__name__}: {error}"
                raise
            finally:
                frame.seconds = time.perf_counter() - start
                recorder._tracing.pop()
            frame.guard_source, frame.entry_source = entry.guard_source, entry.entry_source
            frame.eager_reason = entry.eager_reason
            if entry.graph_module is not None:
                try:
                    frame.fx_graph = entry.graph_module.print_readable(print_output=False)
                except Exception as error:  # the report must never break the program it describes
                    frame.fx_graph = f"(the FX graph did not print: {type(error).__name__}: {error})"
            return entry

        _capture.__wrapped__ = original
        return _capture


_recorder: Recorder | None = None


def enable() -> Recorder:
    """Start recording (once per process; KILN_REPORT does this at import). With config.report set,
    the page is written there at exit."""
    global _recorder
    if _recorder is not None:
        return _recorder
    from kiln.frontend import dispatcher as frontend

    _recorder = Recorder()
    GraphDump.observer = _recorder.on_graph
    frontend.break_listeners.append(_recorder.on_break)
    frontend.Dispatcher._capture = _recorder.capturing(frontend.Dispatcher._capture)
    logging.getLogger("kiln").addFilter(_recorder.filter)
    atexit.register(_write_at_exit)
    return _recorder


def _write_at_exit() -> None:
    if not config.report:
        return
    try:
        path = write(config.report)
    except Exception as error:  # the program has finished: say so, never fail its exit
        print(f"kiln: could not write the compile report to {config.report}: {type(error).__name__}: {error}",
              file=sys.stderr)
        return
    print(f"kiln: compile report written to {path}", file=sys.stderr)


def write(path: str) -> str:
    """Write the page now: to `path` when it ends in .html, else to a new file in the folder `path`.
    Returns the file's path."""
    if not path.endswith(".html"):
        os.makedirs(path, exist_ok=True)
        stamp = datetime.datetime.fromtimestamp(_recorder.started if _recorder else time.time())
        path = os.path.join(path, f"kiln_report_{stamp:%Y%m%d_%H%M%S}_{os.getpid()}.html")
    elif os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    page = render(_recorder)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(temporary, path)
    return path


# ---- rendering -------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1d232a; background: #f6f7f9; }
header { background: #1f2a36; color: #fff; padding: 14px 24px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .meta { color: #c4ccd6; font-size: 12px; }
main { padding: 8px 24px 40px; max-width: 1600px; }
h2 { border-bottom: 2px solid #d5dae0; padding-bottom: 4px; margin-top: 28px; }
h3 { margin: 6px 0; font-size: 15px; display: inline; }
table { border-collapse: collapse; background: #fff; margin: 8px 0; }
th, td { border: 1px solid #d5dae0; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f4; }
td:first-child { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 12px 0; }
.card { background: #fff; border: 1px solid #d5dae0; border-radius: 6px; padding: 8px 14px; min-width: 90px; }
.card b { display: block; font-size: 22px; }
.card.bad b { color: #b3261e; }
details.section { background: #fff; border: 1px solid #d5dae0; border-radius: 6px; margin: 10px 0; padding: 6px 12px; }
details.section > summary { cursor: pointer; }
details.stage { margin: 4px 0 4px 14px; }
details.stage > summary { cursor: pointer; color: #24527a; }
pre { background: #f3f5f7; border: 1px solid #e1e5ea; padding: 8px; overflow: auto; max-height: 560px;
      font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; margin: 4px 0; }
.ok { color: #1e7a34; } .warn { color: #a15c00; } .bad { color: #b3261e; }
.muted { color: #66707a; }
.toolbar button { margin-right: 6px; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
"""

# Expand or collapse every section; opening a link's target (and the sections around it).
_JS = """
(function () {
  function openAround(element) {
    for (var node = element; node; node = node.parentElement) {
      if (node.tagName === "DETAILS") { node.open = true; }
    }
  }
  function openHash() {
    if (!location.hash) { return; }
    var target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (target) { openAround(target); target.scrollIntoView(); }
  }
  function setAll(open) {
    var all = document.querySelectorAll("details");
    for (var i = 0; i < all.length; i++) { all[i].open = open; }
  }
  document.getElementById("expand-all").addEventListener("click", function () { setAll(true); });
  document.getElementById("collapse-all").addEventListener("click", function () { setAll(false); });
  window.addEventListener("hashchange", openHash);
  openHash();
  document.body.setAttribute("data-ready", "1");
})();
"""

# The stage files a graph's section shows, in pipeline order, with their headings; the rest
# (loopir_after_<pass>.txt, kernels) are placed by name.
_STAGES = (("aten_graph.py", "ATen graph"), ("aten_graph_patterns.py", "ATen graph after patterns"),
           ("loopir_before_fusion.txt", "LoopIR before fusion"), ("loopir_after_fusion.txt", "LoopIR after fusion"))


def _e(text) -> str:
    return html.escape(str(text))


def _pre(text: str) -> str:
    return f"<pre><code>{_e(text)}</code></pre>"


def _stage(title: str, body: str, anchor: str | None = None, open_: bool = False) -> str:
    id_attr = f' id="{_e(anchor)}"' if anchor else ""
    return (f'<details class="stage"{id_attr}{" open" if open_ else ""}><summary>{_e(title)}</summary>'
            f"{body}</details>")


def _link(anchor: str, text: str) -> str:
    return f'<a href="#{_e(anchor)}">{_e(text)}</a>'


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def render(recorder: Recorder | None) -> str:
    """The whole page, as a string (None: kiln was not recording; the page says how to turn it on)."""
    recording = recorder is not None
    recorder = recorder or Recorder()
    parts = [_header(recorder), '<main><div class="toolbar"><button id="expand-all">expand all</button>'
             '<button id="collapse-all">collapse all</button></div>']
    if not recording:
        parts.append('<p class="warn">kiln was not recording: set KILN_REPORT before importing kiln, or call '
                     "kiln.debug.html_report.enable() before compiling.</p>")
    parts += [_summary(recorder), _frames(recorder), _breaks(recorder), _graphs(recorder), _warnings(recorder),
              "</main>"]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>kiln compile report</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(parts) + f"\n<script>{_JS}</script></body></html>\n")


def _header(recorder: Recorder) -> str:
    import torch

    import kiln

    started = datetime.datetime.fromtimestamp(recorder.started).strftime("%Y-%m-%d %H:%M:%S")
    values = config.snapshot()
    changed = [f"{option.env_var}={values[option.name]!r}" for option in OPTIONS
               if values[option.name] != option.default and option.name != "report"]
    return (f'<header><h1>kiln compile report</h1><div class="meta">{_e(" ".join(sys.argv) or "python")} · '
            f"pid {os.getpid()} · started {_e(started)} · kiln {_e(kiln.__version__)} · torch {_e(torch.__version__)}"
            f" · options: {_e(', '.join(changed) or 'defaults')}</div></header>")


def _summary(recorder: Recorder) -> str:
    kernels = sum(len(graph.kernels) for graph in recorder.graphs)
    fallbacks = [graph for graph in recorder.graphs if graph.fallback is not None]
    eager = [frame for frame in recorder.frames if frame.eager_reason is not None]
    recompiles = [frame for frame in recorder.frames if frame.recompile_reasons]
    cards = [("frames", len(recorder.frames), False), ("graphs", len(recorder.graphs), False),
             ("kernels", kernels, False), ("graph breaks", len(recorder.breaks), bool(recorder.breaks)),
             ("recompiles", len(recompiles), bool(recompiles)), ("eager frames", len(eager), bool(eager)),
             ("fallbacks", len(fallbacks), bool(fallbacks)),
             ("traced and compiled", f"{sum(frame.seconds for frame in recorder.frames):.2f} s", False),
             ("backend stages", f"{sum(graph.seconds for graph in recorder.graphs):.2f} s", False)]
    out = ['<section id="summary"><h2>Summary</h2><div class="cards">']
    out += [f'<div class="card{" bad" if bad else ""}"><b>{_e(value)}</b>{_e(label)}</div>'
            for label, value, bad in cards]
    out.append("</div>")
    out.append('<table id="summary-frames"><tr><th>frame</th><th>function</th><th>status</th><th>graphs</th>'
               "<th>breaks</th><th>traced</th><th>why traced again</th></tr>")
    for frame in recorder.frames:
        out.append(f"<tr><td>{_link(frame.anchor, f'frame {frame.index}')}</td><td><code>{_e(frame.name)}</code></td>"
                   f"<td>{_status(frame.status)}</td>"
                   f"<td>{' '.join(_link(graph.anchor, graph.anchor) for graph in frame.graphs) or '—'}</td>"
                   f"<td>{' '.join(_link(b.anchor, f'break {b.index}') for b in frame.breaks) or '—'}</td>"
                   f'<td class="num">{_ms(frame.seconds)}</td>'
                   f"<td>{_e('; '.join(frame.recompile_reasons)) or '—'}</td></tr>")
    out.append("</table>")
    out.append('<table id="summary-graphs"><tr><th>graph</th><th>frame</th><th>kind</th><th>ATen nodes</th>'
               "<th>kernels</th><th>status</th><th>compile time</th></tr>")
    for graph in recorder.graphs:
        frame = _link(graph.frame.anchor, f"frame {graph.frame.index}") if graph.frame else "—"
        out.append(f"<tr><td>{_link(graph.anchor, graph.anchor)}</td><td>{frame}</td><td>{_e(graph.kind)}</td>"
                   f'<td class="num">{graph.aten_nodes}</td>'
                   f'<td class="num">{_link(f"{graph.anchor}-kernels", str(len(graph.kernels))) if graph.kernels else 0}'
                   "</td>"
                   f'<td>{_status(graph.status)}</td><td class="num">{_ms(graph.seconds)}</td></tr>')
    out.append("</table>")
    out.append(_stage_totals(recorder))
    out.append("</section>")
    return "\n".join(out)


def _status(status: str) -> str:
    kind = {"captured": "ok", "compiled": "ok", "graph break": "warn"}.get(status, "bad")
    return f'<span class="{kind}">{_e(status)}</span>'


def _stage_totals(recorder: Recorder) -> str:
    totals: dict[str, float] = {}
    for graph in recorder.graphs:
        for stage, seconds in graph.dump.timings.items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    if not totals:
        return ""
    return _timings_table(totals, "stage-totals", "all graphs")


def _timings_table(timings: dict, table_id: str | None, label: str) -> str:
    """One row of stage times (ms), the stages in pipeline order as columns."""
    id_attr = f' id="{_e(table_id)}"' if table_id else ""
    heads = "".join(f"<th>{_e(stage)}</th>" for stage in timings)
    cells = "".join(f'<td class="num">{seconds * 1000:.1f}</td>' for seconds in timings.values())
    return (f'<table class="timings"{id_attr}><tr><th>stage</th>{heads}<th>total</th></tr>'
            f'<tr><td>{_e(label)}, ms</td>{cells}<td class="num">{sum(timings.values()) * 1000:.1f}</td></tr></table>')


def _frames(recorder: Recorder) -> str:
    out = ['<section id="frames"><h2>Frames</h2>']
    if not recorder.frames:
        out.append('<p class="muted">kiln\'s frontend traced no frame (nothing compiled, or frontend="dynamo" / '
                   "torch.compile(backend=\"kiln\"), whose frames TorchDynamo traces).</p>")
    for frame in recorder.frames:
        body = []
        if frame.recompile_reasons:
            body.append("<p><b>traced again:</b> the entries it had failed their guards:</p><ul>"
                        + "".join(f"<li><code>{_e(reason)}</code></li>" for reason in frame.recompile_reasons)
                        + "</ul>")
        if frame.error is not None:
            body.append(f'<p class="bad"><b>the trace raised:</b> {_e(frame.error)}</p>')
        if frame.eager_reason is not None:
            body.append(f'<p class="bad"><b>runs eagerly:</b></p>{_pre(frame.eager_reason)}')
        for graph_break in frame.breaks:
            body.append(f'<p class="warn"><b>{_link(graph_break.anchor, "graph break")}:</b> '
                        f"{_e(graph_break.reason)}<br><code>{_e(graph_break.location)}</code></p>")
        if frame.graphs:
            body.append("<p><b>ATen graphs:</b> " + ", ".join(
                _link(graph.anchor, f"{graph.anchor} ({graph.kind}, {graph.status})") for graph in frame.graphs)
                + "</p>")
        if frame.fx_graph is not None:
            body.append(_stage("FX graph (what the frontend captured)", _pre(frame.fx_graph), f"{frame.anchor}-fx"))
        if frame.entry_source:
            body.append(_stage("entry function (runs the graph, and the code after a break)", _pre(frame.entry_source)))
        if frame.guard_source:
            lines = frame.guard_source.count("\n") + 1
            body.append(_stage(f"guards ({lines} lines)", _pre(frame.guard_source), f"{frame.anchor}-guards"))
        out.append(_section(frame.anchor, f"frame {frame.index}: <code>{_e(frame.name)}</code>",
                            [_status(frame.status), _ms(frame.seconds)], body))
    out.append("</section>")
    return "\n".join(out)


def _section(anchor: str, heading_html: str, facts_html: list, body: list) -> str:
    """One frame's or graph's collapsible section: its heading and facts, then its parts."""
    return (f'<details class="section" id="{_e(anchor)}" open><summary><h3>{heading_html}</h3> · '
            f'{" · ".join(facts_html)}</summary>' + "\n".join(body) + "</details>")


def _breaks(recorder: Recorder) -> str:
    out = ['<section id="breaks"><h2>Graph breaks</h2>']
    if not recorder.breaks:
        out.append('<p class="muted">no graph breaks.</p>')
    else:
        out.append("<table><tr><th>break</th><th>frame</th><th>reason</th><th>where</th><th>source line</th></tr>")
        for graph_break in recorder.breaks:
            frame = _link(graph_break.frame.anchor, f"frame {graph_break.frame.index}") if graph_break.frame else "—"
            out.append(f'<tr id="{_e(graph_break.anchor)}"><td>break {graph_break.index}</td><td>{frame} '
                       f"<code>{_e(graph_break.frame_name)}</code></td><td>{_e(graph_break.reason)}</td>"
                       f"<td><code>{_e(graph_break.location)}</code></td>"
                       f"<td><code>{_e(graph_break.source_line)}</code></td></tr>")
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _graphs(recorder: Recorder) -> str:
    out = ['<section id="graphs"><h2>Graphs</h2>']
    if not recorder.graphs:
        out.append('<p class="muted">no graph was compiled.</p>')
    for graph in recorder.graphs:
        texts = graph.texts
        body = []
        frame = (f"from {_link(graph.frame.anchor, f'frame {graph.frame.index}')} "
                 f"<code>{_e(graph.frame.name)}</code>" if graph.frame else
                 '<span class="muted">compiled outside a frame\'s trace (a backward graph compiled at its first '
                 "use, or a graph TorchDynamo captured)</span>")
        body.append(f"<p>{frame} · {graph.aten_nodes} ATen nodes · {len(graph.kernels)} kernels</p>")
        if graph.fallback is not None:
            body.append(f'<p class="bad"><b>runs eagerly:</b> {_e(graph.fallback.strip().splitlines()[-1])}</p>'
                        + _stage("traceback", _pre(graph.fallback)))
        if graph.dump.timings:
            body.append(_timings_table(graph.dump.timings, None, graph.anchor))
        shown = {"fallback.txt", "timings.txt"}
        for filename, title in _STAGES:
            if filename in texts:
                body.append(_stage(title, _pre(texts[filename]), f"{graph.anchor}-{filename.split('.')[0]}"))
                shown.add(filename)
        for filename, text in texts.items():
            if filename.startswith("loopir_after_") and filename not in shown:
                name = filename[len("loopir_after_"):].rsplit(".", 1)[0]
                body.append(_stage(f"LoopIR after {name}", _pre(text), f"{graph.anchor}-after-{name}"))
                shown.add(filename)
        if "memory_plan.txt" in texts:
            body.append(_stage("memory plan", _pre(texts["memory_plan.txt"]), f"{graph.anchor}-memory"))
            shown.add("memory_plan.txt")
        kernels = graph.kernels
        if kernels:
            items = "".join(_stage(f"kernel {name} ({filename})", _pre(text), f"{graph.anchor}-kernel-{name}")
                            for name, filename, text in kernels)
            body.append(_stage(f"kernels ({len(kernels)})", items, f"{graph.anchor}-kernels"))
            shown.update(filename for _, filename, _ in kernels)
        if "wrapper.py" in texts:
            body.append(_stage("wrapper", _pre(texts["wrapper.py"]), f"{graph.anchor}-wrapper"))
            shown.add("wrapper.py")
        for filename, text in texts.items():  # anything a later backend writes
            if filename not in shown:
                body.append(_stage(filename, _pre(text)))
        out.append(_section(graph.anchor, _e(graph.anchor), [_e(graph.kind), _status(graph.status), _ms(graph.seconds)],
                            body))
    out.append("</section>")
    return "\n".join(out)


def _warnings(recorder: Recorder) -> str:
    out = ['<section id="warnings"><h2>Warnings</h2>']
    if recorder.warnings:
        graphs = {graph.anchor for graph in recorder.graphs}

        def link_graphs(match: re.Match) -> str:  # "graph graph_5 runs eagerly" links to graph_5
            name = html.unescape(match.group(0))
            return _link(name, name) if name in graphs else match.group(0)

        items = "".join(f"<li><pre><code>{re.sub(r'graph_[0-9]+', link_graphs, _e(warning))}</code></pre></li>"
                        for warning in recorder.warnings)
        out.append(f"<ul>{items}</ul>")
    else:
        out.append('<p class="muted">kiln logged no warnings.</p>')
    out.append("</section>")
    return "\n".join(out)


# ---- `kiln report` ------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    """`kiln report [--out DIR] -- python script.py [args]`: run the command with KILN_REPORT=DIR and
    print where its page is. `argv` is what follows `report`. A leading `python` (or `python3`) runs as
    this interpreter, so the script sees the kiln that runs this command. Returns the command's exit
    status (1 when it succeeded but wrote no page)."""
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1:]
    else:
        options, command = [], argv
    parser = argparse.ArgumentParser(prog="kiln report", description="Run a Python program with kiln's compile "
                                     "report on (KILN_REPORT) and print where the page is.")
    parser.add_argument("--out", default="kiln_report", help="folder for the page (default: ./kiln_report)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program, e.g. -- python train.py")
    parsed = parser.parse_args(options if "--" in argv else argv)
    command = command if "--" in argv else parsed.command
    if not command:
        parser.print_usage(sys.stderr)
        print("kiln report: give the program to run after --, e.g. kiln report -- python train.py", file=sys.stderr)
        return 2
    if command[0] in ("python", "python3"):
        command = [sys.executable, *command[1:]]
    out = os.path.abspath(parsed.out)
    os.makedirs(out, exist_ok=True)
    before = {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)}
    environment = {**os.environ, "KILN_REPORT": out}
    try:
        status = subprocess.call(command, env=environment)
    except OSError as error:
        print(f"kiln report: cannot run {command[0]}: {error}", file=sys.stderr)
        return 127
    pages = sorted(os.path.join(out, name) for name in os.listdir(out)
                   if name.endswith(".html") and before.get(name) != os.stat(os.path.join(out, name)).st_mtime_ns)
    for page in pages:
        print(f"kiln report: {page}")
    if not pages:
        print(f"kiln report: no page was written to {out}: did the program import kiln?", file=sys.stderr)
        return status or 1
    return status


__all__ = ["Recorder", "enable", "main", "render", "write"]
