"""Check the built documentation site as a reader sees it, in headless Chromium.

The script behind ``make docs-check``. It serves the built HTML
(``docs/_build/html``) over HTTP from a thread on a free localhost port, so that
search (which fetches ``searchindex.js``) works as on a real host, then checks:

1. The home page renders: HTTP 200, a title naming functrain, a visible h1, and
   a navigation sidebar with links.                          -> home.png
2. The ``functrain.lamb`` entry of the API reference is visible and its
   signature and parameter list name every parameter of
   ``inspect.signature(functrain.lamb)`` (read from the installed package), and
   it cites the paper ("You et al.").                        -> lamb.png
3. Typing "lamb" into the sidebar search box and pressing Enter lists a result
   linking to ``api/optimizers.html#functrain.lamb``.        -> search.png
4. Every page linked from the sidebar (and the home page) loads with no HTTP
   error, console error, page error or failed sub-resource.  -> pages/*.png
5. Unless ``--no-outputs``: every notebook page shows rendered cell outputs and
   notebooks/01_quickstart shows an image output.            -> notebook.png

Each check prints ``ok  <what>`` or ``FAIL <what>: <why>``; the exit status is
1 if any check failed, 2 if Chromium is missing, 0 otherwise.

Usage: python docs/check_site.py [--site docs/_build/html]
       [--chromium /usr/bin/chromium] [--out docs/_build/screenshots] [--no-outputs]
"""
from __future__ import annotations

import argparse
import functools
import http.server
import inspect
import re
import shutil
import sys
import threading
import urllib.parse
from pathlib import Path

from playwright.sync_api import Browser, Page, TimeoutError as PlaywrightTimeout, sync_playwright

import functrain

REPO = Path(__file__).resolve().parent.parent
VIEWPORT = {"width": 1280, "height": 900}
LAMB_ID = "functrain.lamb"
LAMB_TARGET = "api/optimizers.html#functrain.lamb"


class Report:
    """Prints one line per check and remembers whether any failed."""

    def __init__(self) -> None:
        self.failed = 0

    def ok(self, what: str) -> None:
        print(f"ok  {what}", flush=True)

    def fail(self, what: str, why: str) -> None:
        self.failed += 1
        print(f"FAIL {what}: {why}", flush=True)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no access log
        pass


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serves `site` on a free localhost port from a daemon thread; returns (server, base URL)."""
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def check_home(page: Page, base: str, out: Path, r: Report) -> list[str]:
    """Check 1. Returns the de-duplicated same-site page URLs of the sidebar navigation."""
    what = "home page renders"
    resp = page.goto(base + "index.html", wait_until="load")
    problems = []
    if resp is None or resp.status != 200:
        problems.append(f"HTTP {resp.status if resp else 'no response'}")
    if "functrain" not in page.title():
        problems.append(f"title {page.title()!r} does not contain 'functrain'")
    if not page.locator("h1").first.is_visible():
        problems.append("no visible h1")
    hrefs = page.locator(".sidebar-tree a.reference").evaluate_all("els => els.map(a => a.href)")
    if not hrefs:
        problems.append("navigation sidebar (.sidebar-tree a.reference) has no links")
    page.screenshot(path=str(out / "home.png"))
    if problems:
        r.fail(what, "; ".join(problems))
    else:
        r.ok(f"{what} (title {page.title()!r}, {len(hrefs)} sidebar links)")
    urls: list[str] = []
    for href in hrefs:
        url = urllib.parse.urldefrag(href).url
        if url.startswith(base) and url not in urls:
            urls.append(url)
    return urls


def check_lamb(page: Page, base: str, out: Path, r: Report) -> None:
    """Check 2: the lamb entry names every parameter of the installed function."""
    what = "lamb entry shows its arguments"
    page.goto(base + LAMB_TARGET, wait_until="load")
    dt = page.locator(f'dt[id="{LAMB_ID}"]')
    if dt.count() == 0 or not dt.is_visible():
        r.fail(what, f'no visible element with id "{LAMB_ID}" on api/optimizers.html')
        return
    entry = dt.locator("xpath=..")  # the whole <dl class="py function">
    entry.scroll_into_view_if_needed()
    entry.screenshot(path=str(out / "lamb.png"))
    signature = dt.inner_text()
    # Names in bold under the "Parameters" field of this entry (not of nested entries).
    listed = entry.evaluate(
        """dl => {
          for (const f of dl.querySelectorAll(':scope > dd > dl.field-list > dt')) {
            if (f.textContent.trim().startsWith('Parameters'))
              return [...f.nextElementSibling.querySelectorAll('strong')].map(s => s.textContent.trim());
          }
          return [];
        }"""
    )
    expected = list(inspect.signature(functrain.lamb).parameters)
    missing_sig = [n for n in expected if not re.search(rf"\b{re.escape(n)}\b", signature)]
    missing_list = [n for n in expected if n not in listed]
    problems = []
    if missing_sig:
        problems.append(f"signature lacks {missing_sig}")
    if missing_list:
        problems.append(f"parameter list lacks {missing_list} (lists {listed})")
    if "You et al." not in entry.inner_text():
        problems.append("text does not cite 'You et al.'")
    if problems:
        r.fail(what, "; ".join(problems))
    else:
        r.ok(f"{what} (all {len(expected)} parameters in signature and list; cites You et al.)")


def check_search(page: Page, base: str, out: Path, r: Report) -> None:
    """Check 3: sidebar search for "lamb" lists a result linking to the lamb entry."""
    what = 'search for "lamb" finds functrain.lamb'
    page.goto(base + "index.html", wait_until="load")
    box = page.locator("form[role=search] input.sidebar-search")
    if box.count() == 0:
        r.fail(what, "no sidebar search box (form[role=search] input.sidebar-search)")
        return
    box.fill("lamb")
    with page.expect_navigation(wait_until="load"):  # the form submits to search.html?q=lamb
        box.press("Enter")
    # Sphinx's searchtools renders the list item by item, then fills in the summary line.
    results = page.locator("#search-results ul.search li")
    try:
        page.wait_for_function(
            "() => document.querySelector('#search-results p.search-summary')?.innerText.trim()",
            timeout=20_000)
    except PlaywrightTimeout:
        page.screenshot(path=str(out / "search.png"))
        r.fail(what, f"search did not finish within 20 s at {page.url} ({results.count()} results so far)")
        return
    page.mouse.move(0, 0)  # no hover effects in the screenshot
    page.screenshot(path=str(out / "search.png"))
    hrefs = results.locator("a").evaluate_all("els => els.map(a => a.getAttribute('href'))")
    hits = [h for h in hrefs if re.sub(r"\?highlight=[^#]*", "", h).endswith(LAMB_TARGET)]
    summary = page.locator("#search-results p.search-summary").inner_text().strip()
    if not hits:
        r.fail(what, f"no result links to {LAMB_TARGET} ({summary!r}; links: {hrefs[:10]})")
    else:
        r.ok(f"{what} ({results.count()} results; {hits[0]!r} is one)")


def page_name(url: str, base: str) -> str:
    return url[len(base):].replace("/", "_").removesuffix(".html") + ".png"


def load_clean(page: Page, url: str) -> list[str]:
    """Loads `url` and returns the problems seen: HTTP errors, console errors, failed requests."""
    problems: list[str] = []
    on_console = lambda m: problems.append(f"console error: {m.text}") if m.type == "error" else None
    on_pageerror = lambda e: problems.append(f"page error: {e}")
    on_failed = lambda q: problems.append(f"request failed: {q.url} ({q.failure})")
    on_response = lambda s: (problems.append(f"HTTP {s.status} for {s.url}")
                             if s.status >= 400 and s.url != url else None)
    page.on("console", on_console)
    page.on("pageerror", on_pageerror)
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    try:
        resp = page.goto(url, wait_until="networkidle")
        if resp is None or resp.status >= 400:
            problems.insert(0, f"HTTP {resp.status if resp else 'no response'}")
    except Exception as e:  # navigation error, timeout
        problems.append(f"load error: {e}".splitlines()[0])
    finally:
        for event, fn in [("console", on_console), ("pageerror", on_pageerror),
                          ("requestfailed", on_failed), ("response", on_response)]:
            page.remove_listener(event, fn)
    return problems


def check_pages(page: Page, base: str, urls: list[str], out: Path, r: Report) -> None:
    """Check 4: every navigation page (and the home page) loads without errors."""
    (out / "pages").mkdir(parents=True, exist_ok=True)
    pages = [base + "index.html"] + [u for u in urls if u != base + "index.html"]
    bad = 0
    for url in pages:
        rel = url[len(base):]
        problems = load_clean(page, url)
        page.screenshot(path=str(out / "pages" / page_name(url, base)))
        if problems:
            bad += 1
            r.fail(f"page {rel} loads cleanly", "; ".join(problems))
    if bad == 0:
        r.ok(f"all {len(pages)} navigation pages load without errors "
             f"(home + {len(pages) - 1} sidebar links)")
    else:
        print(f"     {len(pages)} pages checked, {bad} with problems")


def check_outputs(page: Page, base: str, urls: list[str], out: Path, r: Report) -> None:
    """Check 5: notebook pages show rendered outputs; the quickstart shows an image."""
    notebooks = [u for u in urls if u[len(base):].startswith("notebooks/")]
    if not notebooks:
        r.fail("notebook pages show outputs", "no notebooks/ pages in the navigation")
        return
    empty = []
    for url in notebooks:
        page.goto(url, wait_until="load")
        if page.locator("div.cell_output").count() == 0:
            empty.append(url[len(base):])
    hint = " (were the notebooks executed? see nb_execution_mode / FUNCTRAIN_DOCS_EXECUTE in docs/conf.py)"
    if empty:
        r.fail("notebook pages show outputs",
               f"{len(empty)} of {len(notebooks)} have no rendered output (div.cell_output): "
               f"{', '.join(empty)}{hint}")
    else:
        r.ok(f"all {len(notebooks)} notebook pages show rendered outputs")
    what = "notebooks/01_quickstart shows an image output"
    quick = [u for u in notebooks if "01_quickstart" in u]
    if not quick:
        r.fail(what, "notebooks/01_quickstart is not linked from the navigation")
        return
    page.goto(quick[0], wait_until="networkidle")
    img = page.locator("div.cell_output img")
    if img.count() == 0:
        r.fail(what, "no image in any cell output (div.cell_output img)" + hint)
        return
    img.first.scroll_into_view_if_needed()
    page.screenshot(path=str(out / "notebook.png"))
    r.ok(f"{what} ({img.count()} images)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", default="docs/_build/html", help="built HTML site (relative to the repo)")
    ap.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable")
    ap.add_argument("--out", default="docs/_build/screenshots", help="where screenshots go")
    ap.add_argument("--no-outputs", action="store_true", help="skip check 5 (notebook outputs)")
    args = ap.parse_args()
    site, out = REPO / args.site, REPO / args.out
    chromium = shutil.which(args.chromium) or args.chromium
    if not Path(chromium).is_file():
        print(f"Chromium not found at {args.chromium}: `apt-get install chromium` "
              f"(or pass --chromium PATH)", file=sys.stderr)
        return 2
    if not (site / "index.html").is_file():
        print(f"no built site at {site} (build the docs first)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    for stale in [*out.glob("*.png"), *out.glob("pages/*.png")]:  # never report old screenshots
        stale.unlink()

    r = Report()
    server, base = serve(site)
    try:
        with sync_playwright() as p:
            browser: Browser = p.chromium.launch(executable_path=chromium, headless=True,
                                                 args=["--no-sandbox"])
            page = browser.new_page(viewport=VIEWPORT)
            urls = check_home(page, base, out, r)
            check_lamb(page, base, out, r)
            check_search(page, base, out, r)
            check_pages(page, base, urls, out, r)
            if args.no_outputs:
                print("skip notebook outputs (--no-outputs)")
            else:
                check_outputs(page, base, urls, out, r)
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"screenshots in {out}")
    print(f"{r.failed} check(s) failed" if r.failed else "all checks passed")
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main())
