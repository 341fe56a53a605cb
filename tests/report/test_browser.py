"""The quick demo's HTML report in a real browser: `make test-browser` (marker `browser`, outside the default
suite; docs/testing.md). Debian's Chromium (/usr/bin/chromium, or GENOME_LM_CHROMIUM), headless, driven by
Playwright (the `browser` extra, in requirements.lock; its own browser download is not used).

`genome-lm demo --quick` is run once and its page opened from file://. Checked: every section's
heading is visible with content of non-zero size below it, every image decoded (naturalWidth > 0) and shown,
every table shown, and the page logs no console error, throws no error and fails no request. A report of a
variants output folder (its "Variant effect by context" section) is checked the same way. A third test
breaks a copy of the page (a corrupt PNG, a script that throws, a section removed) and checks that the same
checks name each break. A full-page screenshot goes to build/browser/demo_quick.png (GENOME_LM_BROWSER_OUT:
another folder); its path is printed.

Without playwright or Chromium the tests skip, except under `make test-browser` (GENOME_LM_TEST_BROWSER=1),
where they fail."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("GENOME_LM_CHROMIUM", "/usr/bin/chromium"))
# As root in a container: no sandbox; and no connection chromium would open on its own (a closed network
# refuses them, which it logs as errors).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 900}

TITLE = "genome_lm demo: base vs short- vs long-context fine-tune"
SECTIONS = [
    "Evals",
    "Loss vs preceding context",
    "Relative change vs preceding context",
    "Is the gain from context, or from more training?",
    "Does the model read distant sequence? (context ablation)",
    "Does it hold on the other strand?",
    "Is the held-out chromosome really held out? (leakage and annotation strata)",
    "Repeat-masked vs unmasked bases",
    "Training curves",
    "Tables",
]
FIGURES = ["loss vs preceding context", "relative change vs context", "context vs more training",
           "context ablation", "both strands", "leakage", "repeat vs non-repeat", "training curves"]  # <img alt>

# Each h2 with the size of what follows it up to the next h2 (the report has no <section> elements).
SECTIONS_JS = """() => [...document.querySelectorAll('h1, h2')].map(h => {
  let n = 0, height = 0;
  for (let el = h.nextElementSibling; el && !/^H[12]$/.test(el.tagName); el = el.nextElementSibling) {
    const r = el.getBoundingClientRect(); n += 1; height += r.height;
  }
  const r = h.getBoundingClientRect();
  return {tag: h.tagName.toLowerCase(), text: h.textContent, width: r.width, height: r.height,
          body_elements: n, body_height: height};
})"""
IMAGES_JS = """() => [...document.images].map(i => {
  const r = i.getBoundingClientRect();
  return {alt: i.alt, complete: i.complete, natural_width: i.naturalWidth, natural_height: i.naturalHeight,
          width: r.width, height: r.height, src: i.currentSrc.slice(0, 40)};
})"""
TABLES_JS = """() => [...document.querySelectorAll('table')].map(t => {
  const r = t.getBoundingClientRect();
  return {caption: t.caption ? t.caption.textContent : '', rows: t.rows.length, width: r.width, height: r.height};
})"""


def _unavailable(why: str):
    if os.environ.get("GENOME_LM_TEST_BROWSER") == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium with a fresh profile: a Playwright BrowserContext."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if sync_playwright is None:
        _unavailable("playwright is not installed: `make setup` installs it (requirements.lock, extra `browser`)")
    if not CHROMIUM.exists():
        _unavailable(f"{CHROMIUM} is missing: `make test-browser` installs Debian's chromium")
    with sync_playwright() as p, tempfile.TemporaryDirectory(prefix="genome_lm-chromium-") as profile:
        context = p.chromium.launch_persistent_context(profile, executable_path=str(CHROMIUM), headless=True,
                                                       args=CHROMIUM_ARGS, viewport=VIEWPORT)
        context.set_default_timeout(60_000)  # a busy 2-core machine
        try:
            yield context
        finally:
            context.close()


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    """reports/demo_quick.html of a fresh `genome-lm demo --quick` (about a minute on 2 cores)."""
    from genome_lm.cli import main

    root = tmp_path_factory.mktemp("demo")
    assert main(["demo", "--quick", "--root", str(root)]) == 0
    return root / "reports" / "demo_quick.html"


def check_page(context, page_path: Path, screenshot: Path | None = None,
               want: tuple[str, list[str], list[str]] = (TITLE, SECTIONS, FIGURES)) -> list[str]:
    """Open `page_path` and return what is wrong with it, one line each (empty: nothing). `screenshot`: write a
    full-page PNG there. `want`: the page's title, section headings and image alts."""
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(f"console error: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url[:80]}: {r.failure}"))
    try:
        page.goto(page_path.as_uri(), wait_until="load")
        sections, images, tables = page.evaluate(SECTIONS_JS), page.evaluate(IMAGES_JS), page.evaluate(TABLES_JS)
        shown_text = page.inner_text("body")
        visible = [page.locator("h1, h2").nth(i).is_visible() for i in range(len(sections))]
        if screenshot is not None:
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
    finally:
        page.close()
    problems = list(errors)
    headings = [(s["tag"], s["text"]) for s in sections]
    title, titles, figures = want
    expected = [("h1", title)] + [("h2", t) for t in titles]
    if headings != expected:
        problems.append(f"headings: missing {[t for t in expected if t not in headings]}, "
                        f"unexpected {[t for t in headings if t not in expected]}")
    for s, shown in zip(sections, visible):
        if not (shown and s["width"] > 0 and s["height"] > 0):
            problems.append(f"heading {s['text']!r} not visible ({s['width']:.0f} x {s['height']:.0f} px)")
        if s["tag"] == "h2" and not (s["body_elements"] and s["body_height"] > 0):
            problems.append(f"section {s['text']!r} is empty ({s['body_elements']} elements, "
                            f"{s['body_height']:.0f} px high)")
    if [i["alt"] for i in images] != figures:
        problems.append(f"images: {[i['alt'] for i in images]}, expected {figures}")
    for i in images:
        if not (i["complete"] and i["natural_width"] > 0 and i["natural_height"] > 0):
            problems.append(f"image {i['alt']!r} is broken (naturalWidth {i['natural_width']}, src {i['src']}...)")
        elif not (i["width"] > 0 and i["height"] > 0):
            problems.append(f"image {i['alt']!r} not shown ({i['width']:.0f} x {i['height']:.0f} px)")
    if not tables:
        problems.append("no tables")
    for entity in sorted(set(re.findall(r"&[a-zA-Z]+;|&#\d+;", shown_text))):  # escaped twice: shown as text
        problems.append(f"the page shows {entity!r} as text")
    for t in tables:
        if not (t["rows"] > 1 and t["width"] > 0 and t["height"] > 0):
            problems.append(f"table {t['caption']!r} not shown ({t['rows']} rows, {t['width']:.0f} x "
                            f"{t['height']:.0f} px)")
    return problems


def test_quick_demo_report_renders_in_chromium(browser, demo_report, capsys):
    shot = demo_report.parent / "browser" / "demo_quick.png"
    problems = check_page(browser, demo_report, screenshot=shot)
    out_dir = Path(os.environ.get("GENOME_LM_BROWSER_OUT") or ROOT / "build" / "browser")
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = Path(shutil.copy2(shot, out_dir / shot.name))
    with capsys.disabled():
        print(f"\nscreenshot: {kept} (full page, {kept.stat().st_size // 1024} kB)")
    assert not problems, "\n".join(problems)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variants_section_renders_in_chromium(browser, tmp_path):
    """A report of a variants output folder (tests/report/conftest.py's fixture): its section, both figures and
    the AUROC / AUPRC table render."""
    from genome_lm.report import write_report
    from tests.report.conftest import write_variants_output

    page = write_report([write_variants_output(tmp_path / "brca1")], out=tmp_path / "variants.html")
    problems = check_page(browser, page, want=("genome_lm: loss by preceding context", ["Variant effect by context"],
                                               ["ROC by context", "score shift vs context"]))
    assert not problems, "\n".join(problems)


def test_the_checks_name_each_break(browser, demo_report, tmp_path):
    """A copy of the page with a corrupt PNG, a script that logs an error and throws, and the training-curves
    heading removed: each is reported."""
    page = demo_report.read_text(encoding="utf-8")
    marker = "data:image/png;base64,"
    start = page.index(marker) + len(marker)
    broken = page[:start] + "A" * 64 + page[start + 64:]  # the first figure: its PNG signature and header zeroed
    broken = broken.replace("<h2>Training curves</h2>", "", 1)
    broken = broken.replace("</h1>", "</h1><p>a CI of &amp;ndash; here</p>", 1)  # an entity escaped twice
    broken = broken.replace("</body>", "<script>console.error('injected'); undefinedFunction();</script></body>")
    copy = tmp_path / "broken.html"
    copy.write_text(broken, encoding="utf-8")
    problems = check_page(browser, copy)
    text = "\n".join(problems)
    assert f"image {FIGURES[0]!r} is broken" in text, text
    assert "console error: injected" in text, text
    assert "page error: " in text and "undefinedFunction" in text, text
    assert "missing [('h2', 'Training curves')]" in text, text
    assert "the page shows '&ndash;' as text" in text, text
    assert len(problems) == 5, text  # nothing else: the rest of the page still passes
