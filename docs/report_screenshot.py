"""Regenerate docs/report_screenshot.png: kiln's compile report of a 2-layer GPT-2 on CPU.

    python docs/report_screenshot.py          # needs transformers and Debian's chromium

Compiles the model in a child process with KILN_REPORT set (`kiln report`), then has headless
Chromium take the screenshot of the page.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRAM = """
import torch
import transformers
import kiln

config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2)
model = transformers.GPT2LMHeadModel(config).eval()
ids = torch.randint(0, config.vocab_size, (2, 16))
with torch.no_grad():
    logits = kiln.compile(model)(input_ids=ids).logits
    print("max error vs eager:", (logits - model(input_ids=ids).logits).abs().max().item())
"""


def main() -> None:
    sys.path.insert(0, ROOT)
    from kiln.debug import html_report

    with tempfile.TemporaryDirectory() as folder:
        script = os.path.join(folder, "gpt2.py")
        with open(script, "w") as handle:
            handle.write(PROGRAM)
        os.environ["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
        status = html_report.main(["--out", os.path.join(folder, "report"), "--", "python", script])
        if status:
            sys.exit(status)
        page, = glob.glob(os.path.join(folder, "report", "*.html"))
        subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        "--hide-scrollbars", f"--user-data-dir={os.path.join(folder, 'profile')}",
                        f"--screenshot={os.path.join(ROOT, 'docs', 'report_screenshot.png')}",
                        "--window-size=1400,1000", "file://" + page], check=True, capture_output=True)
        print("wrote docs/report_screenshot.png")


if __name__ == "__main__":
    main()
