"""Render rnnconvert's HTML reports in headless Chromium at 1280 and 1600 px and printed to PDF (A4), and check
that no table column is cut: no table wider than the page, no cell whose content overflows it, every image
decoded. Issue #42 ("the report checked in headless Chromium at 1280 and 1600 px and printed to PDF with no cut
column").

Needs Debian's Chromium (``apt-get install -y chromium``) and the ``playwright`` Python package (used only to
drive that browser: ``pip install playwright``; no browser download). Not part of the test suite.

    python bench/report_browser_check.py OUT_DIR REPORT.html [REPORT.html ...]

Prints one line per report and page size, writes ``<name>-<width>.png`` and ``<name>.pdf`` to OUT_DIR, exits 1
when a check fails.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

MEASURE = """() => {
  const page = document.documentElement.scrollWidth, view = document.documentElement.clientWidth;
  const wide = [...document.querySelectorAll('table')].filter(t => t.getBoundingClientRect().right > view + 1).length;
  const cut = [...document.querySelectorAll('td, th')].filter(c => c.scrollWidth > c.clientWidth + 1).length;
  const imgs = [...document.images];
  return {page, view, tables: document.querySelectorAll('table').length, wide, cut,
          images: imgs.length, broken: imgs.filter(i => !(i.naturalWidth > 0)).length};
}"""


def main(out: Path, reports: list[Path]) -> int:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        print("Chromium is not installed (Debian: apt-get install -y chromium)")
        return 2
    out.mkdir(parents=True, exist_ok=True)
    bad = 0
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        for rep in reports:
            for width in (1280, 1600, "print"):
                page = browser.new_page(viewport={"width": 794 if width == "print" else width, "height": 1000})
                page.goto(rep.resolve().as_uri())
                if width == "print":
                    page.emulate_media(media="print")
                    page.pdf(path=str(out / f"{rep.stem}.pdf"), format="A4")
                else:
                    page.screenshot(path=str(out / f"{rep.stem}-{width}.png"), full_page=True)
                m = page.evaluate(MEASURE)
                ok = m["page"] <= m["view"] and m["wide"] == 0 and m["cut"] == 0 and m["broken"] == 0
                bad += not ok
                print(f"{rep.name} {width}: {'ok' if ok else 'CUT'} page {m['page']}/{m['view']} px, "
                      f"{m['tables']} tables ({m['wide']} wider than the page), {m['cut']} cells cut, "
                      f"{m['images']} images ({m['broken']} not decoded)")
                page.close()
        browser.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
