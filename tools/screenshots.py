"""Screenshots of report.html (and a history page) in headless Chromium, at the widths people read at.

    python tools/screenshots.py RUN_DIR [--history HISTORY.jsonl] [--out DIR] [--widths 1400 800]

RUN_DIR is a run directory (or a report root, through `latest`): its report.html is re-rendered from
its ledger and run.json into OUT (the run directory is not touched), then shot at each width twice:
the first screen (`report-1400-fold.png`, 900 px high: the verdict and the headline table belong
there) and the whole page (`report-1400-full.png`). With --history, the history page too.

Needs a Chromium (Debian: `apt-get install chromium`; or set CHROMIUM=/path/to/chrome). Nothing
else is fetched: the page is standalone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from replaytests.errors import ReplaytestsError
from replaytests.outputs import history
from replaytests.outputs.ledger import collate
from replaytests.outputs.report import write_report
from replaytests.outputs.runs import report_meta

FOLD = 900  # px: the first screen
FULL = 12000  # px: tall enough for a whole report (Chromium crops the page to this height)


def chromium() -> str:
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("screenshots: no Chromium found (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")


def shoot(browser: str, page: Path, png: Path, width: int, height: int) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={png}",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=120)
    print(png)


def render(run: Path, history_file: Path | None, out: Path) -> dict[str, Path]:
    """The pages to shoot: the run's report re-rendered into `out`, and the history page."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReplaytestsError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
    pages = {"report": write_report(out, collate([run]), report_meta([run]))[2]}
    if history_file:
        pages["history"] = out / "history.html"
        history.show(history_file, pages["history"])
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory, or a report root (through latest)")
    parser.add_argument("--history", type=Path, default=None, help="a history file to draw as well")
    parser.add_argument("--out", type=Path, default=Path("screenshots"))
    parser.add_argument("--widths", type=int, nargs="+", default=[1400, 800])
    args = parser.parse_args()
    browser = chromium()
    try:  # a bad ledger, run.json or history: one line, as replaytests itself says it
        pages = render(args.run, args.history, args.out)
    except ReplaytestsError as exc:
        print(f"screenshots: error: {exc}", file=sys.stderr)
        return 2
    for name, page in pages.items():
        for width in args.widths:
            shoot(browser, page, args.out / f"{name}-{width}-fold.png", width, FOLD)
            shoot(browser, page, args.out / f"{name}-{width}-full.png", width, FULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
