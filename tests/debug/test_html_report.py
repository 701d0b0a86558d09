"""kiln's compile report (kiln/debug/html_report.py): `kiln report -- python script.py` writes one
self-contained page that shows every frame, break, graph, stage and kernel, and loads cleanly in
a real browser (Debian's headless Chromium; skipped, saying why, where it is not installed)."""
from __future__ import annotations

import contextlib
import glob
import html
import html.parser
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

# A 2-layer MLP; a function with a graph break (a tensor's value printed between two ops),
# called again with another rank (a recompile); a function whose graph falls back (a lowering
# made to fail); a name with HTML in it.
PROGRAM = r'''
import torch
import kiln
from kiln import _torch
from kiln.lowering.registry import LOWERINGS

model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
kiln.compile(model)(torch.randn(2, 8))

def breaks(x):
    y = torch.sin(x) * 2
    print("side effect", y)  # a tensor's value printed: a graph break
    return torch.cos(y) + 1

compiled = kiln.compile(breaks)
compiled(torch.randn(5))
compiled(torch.randn(5, 3))

def no_tanh(*args, **kwargs):
    raise NotImplementedError("tanh <lowering> removed by the test")

LOWERINGS[_torch.aten.tanh.default] = no_tanh
def falls_back(x):
    return torch.tanh(x) + 1

kiln.compile(falls_back)(torch.randn(4))

import sys
from kiln.debug import html_report
html_report.write(sys.argv[1])  # on demand, besides the page written at exit
'''


class _Page(html.parser.HTMLParser):
    """The page's ids, the tags and attributes that could load something, and the text of each <pre>."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.loads: list[str] = []
        self.hrefs: list[str] = []
        self.pres: list[str] = []
        self.headings: list[str] = []
        self._pre: list[str] | None = None
        self._heading: list[str] | None = None
        self.styles = ""
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "id" in attrs:
            self.ids.add(attrs["id"])
        if tag in ("link", "img", "iframe", "object", "embed", "source", "video", "audio") or "src" in attrs:
            self.loads.append(f"<{tag} {attrs}>")
        if "href" in attrs:
            self.hrefs.append(attrs["href"])
        if tag == "pre":
            self._pre = []
        if tag == "h2":
            self._heading = []
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "pre" and self._pre is not None:
            self.pres.append("".join(self._pre))
            self._pre = None
        if tag == "h2" and self._heading is not None:
            self.headings.append("".join(self._heading))
            self._heading = None
        self._in_style = False

    def handle_data(self, data):
        if self._pre is not None:
            self._pre.append(data)
        if self._heading is not None:
            self._heading.append(data)
        if self._in_style:
            self.styles += data


def _numbered(ids: set, prefix: str) -> list:
    """The ids `prefix<n>`, in order of n."""
    return sorted((anchor for anchor in ids if anchor.startswith(prefix) and anchor[len(prefix):].isdigit()),
                  key=lambda anchor: int(anchor[len(prefix):]))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Run PROGRAM through `kiln report` (KILN_DEBUG on too, to compare with); the page, its parse,
    the debug dump's folder and what `kiln report` printed."""
    from kiln.debug import html_report

    folder = tmp_path_factory.mktemp("report")
    script = folder / "program.py"
    script.write_text(PROGRAM)
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "KILN_DEBUG", "KILN_DEBUG_DIR")}
    os.environ.update(PYTHONPATH=str(ROOT), KILN_DEBUG="1", KILN_DEBUG_DIR=str(folder / "debug"))
    output = os.open(folder / "printed.txt", os.O_WRONLY | os.O_CREAT)
    saved_stdout = os.dup(1)
    try:
        sys.stdout.flush()
        os.dup2(output, 1)  # the child's output, to read back
        with contextlib.redirect_stdout(io.StringIO()) as lines:  # main()'s own
            status = html_report.main(["--out", str(folder / "out"), "--", "python", str(script),
                                       str(folder / "on_demand" / "page.html")])
    finally:
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        os.close(output)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    printed = (folder / "printed.txt").read_text() + lines.getvalue()
    assert status == 0, printed
    pages = glob.glob(str(folder / "out" / "*.html"))
    assert len(pages) == 1, (pages, printed)
    text = pathlib.Path(pages[0]).read_text()
    parsed = _Page()
    parsed.feed(text)
    return pages[0], text, parsed, folder / "debug", printed


def test_kiln_report_prints_where_its_one_page_is(report):
    page, _, _, _, printed = report
    assert f"kiln report: {page}" in printed
    on_demand = pathlib.Path(page).parent.parent / "on_demand" / "page.html"  # html_report.write(path)
    assert on_demand.exists() and "Sequential.forward" in on_demand.read_text()


def test_page_is_self_contained(report):
    _, text, parsed, _, _ = report
    assert parsed.loads == []  # no <link>, <img>, <iframe>, src=...: nothing to fetch
    assert parsed.hrefs and all(href.startswith("#") for href in parsed.hrefs), parsed.hrefs
    assert "url(" not in parsed.styles and "@import" not in parsed.styles
    assert "<style>" in text and "<script>" in text  # inline CSS and JS


def test_page_shows_frames_breaks_graphs_and_links_them(report):
    _, text, parsed, _, _ = report
    assert parsed.headings == ["Summary", "Frames", "Graph breaks", "Graphs", "Warnings"]
    # frames: the MLP, the function before its break, its resume function, the recompile, the fallback
    frames, graphs = _numbered(parsed.ids, "frame_"), _numbered(parsed.ids, "graph_")
    assert len(frames) >= 5 and len(graphs) >= 5, (frames, graphs)
    for anchor in frames + graphs + ["break_0"]:
        assert f'href="#{anchor}"' in text, f"the summary does not link {anchor}"  # every section is linked
    assert f"{frames[0]}-fx" in parsed.ids and f"{frames[0]}-guards" in parsed.ids  # FX graph, guards
    assert "Sequential.forward" in text
    # the break: its reason and its source line
    assert "print()" in text and html.escape('print("side effect", y)  # a tensor\'s value printed') in text
    # the recompile, with the guard that failed
    assert "rank mismatch" in text
    # the fallback, with its reason (escaped), in the graph's section and the warnings
    assert html.escape("tanh <lowering> removed by the test") in text and "runs eagerly" in text
    fallback = graphs[-1]  # the last graph compiled: falls_back's
    assert f'kiln: graph <a href="#{fallback}">{fallback}</a> runs eagerly' in text  # the warning links it
    assert {href[1:] for href in parsed.hrefs} <= parsed.ids  # no link goes nowhere
    assert {f"{graph}-kernels" for graph in graphs[:-1]} <= {href[1:] for href in parsed.hrefs}
    for stage in ("ATen graph", "LoopIR before fusion", "LoopIR after fusion", "memory plan", "wrapper"):
        assert f"<summary>{stage}</summary>" in text, stage
    assert '<table class="timings" id="stage-totals">' in text and "<th>lower</th>" in text  # stage timings


def test_page_holds_every_kernel_and_wrapper_of_the_debug_dump_verbatim(report):
    """The same process's KILN_DEBUG dump is the reference: each kernel and wrapper file is on the
    page, under its kernel's name, and reads back exactly (C++ loops' `<` escaped, not lost)."""
    _, text, parsed, debug, _ = report
    kernels = glob.glob(str(debug / "*" / "*" / "kernel_*"))
    wrappers = glob.glob(str(debug / "*" / "*" / "wrapper.py"))
    assert kernels and len(wrappers) >= 4, (kernels, wrappers)
    for path in kernels + wrappers:
        source = pathlib.Path(path).read_text()
        assert source in parsed.pres, f"{path} is not shown verbatim"
    assert any("<" in pathlib.Path(path).read_text() for path in kernels)  # escaping was exercised
    for path in kernels:
        name = os.path.basename(path)
        assert f"({name})" in text, name
    count = len(kernels)
    assert f"<b>{count}</b>kernels" in text  # the summary's kernel count


def test_recording_is_off_and_costs_nothing_without_kiln_report(tmp_path):
    probe = ("import sys, torch, kiln\n"
             "from kiln.debug.dump import GraphDump\n"
             "from kiln.frontend.dispatcher import Dispatcher\n"
             "kiln.compile(lambda x: x.sin() + 1)(torch.randn(3))\n"
             "print('kiln.debug.html_report' in sys.modules, GraphDump.observer, hasattr(Dispatcher._capture, "
             "'__wrapped__'))\n")
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "KILN_REPORT": ""}
    result = subprocess.run([sys.executable, "-c", probe], env=environment, capture_output=True, text=True,
                            cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False None False"
    assert list(tmp_path.iterdir()) == []


def test_render_escapes_every_text():
    from kiln.debug import html_report
    from kiln.debug.dump import GraphDump

    recorder = html_report.Recorder()
    dump = GraphDump("graph_<b>", None)
    dump.kept = {"kernel_k<0>.py": "<script>alert('kernel')</script>", "wrapper.py": "if a < b and c > d: pass"}
    recorder.graphs.append(html_report.GraphRecord(dump, 1, "forward", None))
    recorder.frames.append(html_report.FrameRecord(0, "f<script>", ["x < 3 & y"], guard_source="<img src=x>"))
    recorder.warnings.append("<iframe src='http://example.com'>")
    page = html_report.render(recorder)
    for raw in ("<script>alert", "graph_<b>", "<img src=x>", "<iframe", "f<script>", "k<0>", "x < 3"):
        assert raw not in page, raw
    for escaped in ("&lt;script&gt;alert(&#x27;kernel&#x27;)", "graph_&lt;b&gt;", "if a &lt; b and c &gt; d", "x &lt; 3 &amp; y",
                    "&lt;img src=x&gt;"):
        assert escaped in page, escaped


# ---- in a real browser ------------------------------------------------------------------------

def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on PATH: the compile report is not checked in a browser here "
                "(scripts/env.sh installs Debian's chromium when run as root)")


def _load(url: str, *extra: str) -> tuple[str, list[str]]:
    """Load `url` in headless Chromium: (the DOM after its scripts ran, the console messages)."""
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                                 "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                                 *extra, url], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    return result.stdout, console


def test_the_console_check_sees_errors(tmp_path):
    """The browser check below would pass on any page if Chromium's console did not reach it."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><h2>x</h2><script>console.error('boom'); missing();</script>"
                    "</body></html>")
    dom, console = _load(page.as_uri(), "--dump-dom")
    assert "<h2>x</h2>" in dom
    assert any("boom" in line for line in console) and any("missing is not defined" in line for line in console)


def test_page_loads_in_chromium_without_console_errors(report, tmp_path):
    page, _, parsed, _, _ = report
    graph = _numbered(parsed.ids, "graph_")[0]
    dom, console = _load(pathlib.Path(page).as_uri() + f"#{graph}-wrapper", "--dump-dom")
    assert console == [], console
    assert 'data-ready="1"' in dom  # its script ran to the end
    for heading in ("Summary", "Frames", "Graph breaks", "Graphs", "Warnings"):
        assert f"<h2>{heading}</h2>" in dom, heading
    assert f'id="{graph}-wrapper" open=""' in dom  # following a link opens the section it points to
    screenshot = tmp_path / "report.png"
    _, console = _load(pathlib.Path(page).as_uri(), f"--screenshot={screenshot}", "--window-size=1400,1000",
                       "--hide-scrollbars")
    assert console == [], console
    data = screenshot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, len(data)


def test_kiln_report_passes_the_exit_status_on_and_says_when_no_page_was_written(tmp_path, capsys):
    from kiln.debug import html_report

    assert html_report.main([]) == 2
    assert "give the program to run after --" in capsys.readouterr().err
    out = str(tmp_path / "out")
    assert html_report.main(["--out", out, "--", "python", "-c", "import sys; sys.exit(3)"]) == 3
    assert html_report.main(["--out", out, "python", "-c", "pass"]) == 1  # ran fine, but kiln never ran
    assert "no page was written" in capsys.readouterr().err


def test_a_page_written_without_recording_says_how_to_turn_it_on():
    from kiln.debug import html_report

    assert "set KILN_REPORT before importing kiln" in html_report.render(None)
    assert "set KILN_REPORT" not in html_report.render(html_report.Recorder())
