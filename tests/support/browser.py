"""Drive the interactive map in headless Chromium (Debian ``chromium``, through Playwright)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHROMIUM = "/usr/bin/chromium"
# No network here: without these, Chromium keeps trying Google's hosts.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

POINT_FILLS = """() => [...document.querySelectorAll('#map .scatterlayer .trace')[1].querySelectorAll('path.point')]
                       .map(p => p.style.fill)"""


@contextmanager
def map_page(html: Path, errors: list, requests: list | None = None) -> Iterator:
    """The page ``html`` open in headless Chromium (1400 x 900), its points drawn; page errors
    appended to ``errors`` and, with ``requests``, URLs other than file:/data:/about:/blob:."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        if requests is not None:
            page.on("request", lambda r: None if r.url.split(":")[0] in ("file", "data", "about", "blob")
                    else requests.append(r.url))
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(html.resolve().as_uri())
        page.wait_for_selector("#map .scatterlayer .trace path.point")
        try:
            yield page
        finally:
            browser.close()


def inspect_map_page(html: Path, screenshot: Path, *, colour_field: str, search: str, hover_index: int = 0) -> dict:
    """Open ``html`` from disk, exercise it, save a screenshot; return what was seen.

    Returns a dict: ``points`` (rendered markers of the encoder trace), ``fills_before`` /
    ``fills_after`` (marker colours before and after choosing ``colour_field``), ``hover``
    (hover label text of point ``hover_index``), ``highlighted`` (markers in the search
    highlight), ``info`` (the side panel), ``range_before`` / ``range_after`` (x range before
    and after a wheel zoom), ``requests`` (URLs other than file:/data:/about:), ``errors``
    (page errors), ``pwned`` (``window.__pwned``: set only if injected HTML ran).
    """
    seen: dict = {"requests": [], "errors": []}
    with map_page(html, seen["errors"], seen["requests"]) as page:
        seen["points"] = page.evaluate(
            "() => document.querySelectorAll('#map .scatterlayer .trace')[1].querySelectorAll('path.point').length")
        seen["fills_before"] = page.evaluate(POINT_FILLS)
        page.select_option("#color-by", colour_field)
        page.wait_for_timeout(200)
        seen["fills_after"] = page.evaluate(POINT_FILLS)
        seen["legend"] = page.inner_text("#legend")
        page.evaluate(f"() => Plotly.Fx.hover('map', [{{curveNumber: 1, pointNumber: {hover_index}}}])")
        page.wait_for_timeout(200)
        seen["hover"] = page.evaluate("() => document.querySelector('#map .hoverlayer').textContent")
        page.fill("#search", search)
        page.wait_for_timeout(200)
        seen["highlighted"] = page.evaluate(
            "() => document.querySelectorAll('#map .scatterlayer .trace')[2].querySelectorAll('path.point').length")
        seen["info"] = page.inner_text("#info")
        seen["range_before"] = page.evaluate("() => [...document.getElementById('map').layout.xaxis.range]")
        box = page.locator("#map .nsewdrag").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, -400)
        page.wait_for_timeout(400)
        seen["range_after"] = page.evaluate("() => [...document.getElementById('map').layout.xaxis.range]")
        page.evaluate("() => Plotly.relayout('map', {'xaxis.autorange': true, 'yaxis.autorange': true})")
        page.wait_for_timeout(200)
        page.screenshot(path=str(screenshot))
        seen["pwned"] = page.evaluate("() => window.__pwned === undefined ? null : window.__pwned")
    return seen


def inspect_svg(svg: Path, screenshot: Path) -> dict:
    """Open a static SVG figure in Chromium, save a screenshot; return its rendered size, how many
    text groups and image elements it drew, and page errors."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(svg.resolve().as_uri())
        box = page.evaluate("() => { const r = document.documentElement.getBoundingClientRect(); "
                            "return [r.width, r.height]; }")
        texts = page.evaluate("() => document.querySelectorAll('g[id^=\"text_\"]').length")
        images = page.evaluate("() => document.querySelectorAll('image').length")
        page.screenshot(path=str(screenshot))
        browser.close()
    return {"size": box, "texts": texts, "images": images, "errors": errors}


def inspect_layouts_and_lineage(html: Path, screenshots: tuple[Path, Path], *, hover_index: int) -> dict:
    """Switch the page's layout and turn on lineage arrows; screenshots of both layouts.

    Returns ``positions`` (marker transforms of the encoder trace) and ``faithfulness`` (side
    panel text) per layout shown, ``arrows`` (rendered lineage arrows before / after the
    checkbox), ``hover`` (hover text of point ``hover_index``), ``title`` per layout, ``errors``.
    """
    # The encoder trace is the one with the most markers (plotly leaves empty traces out of the DOM).
    pos = """() => [...document.querySelectorAll('#map .scatterlayer .trace')]
                   .map(t => [...t.querySelectorAll('path.point')]).sort((a, b) => b.length - a.length)[0]
                   .map(p => p.getAttribute('transform'))"""
    arrows = "() => document.querySelectorAll('#map .annotation-arrow-g').length"
    seen: dict = {"errors": [], "positions": [], "faithfulness": [], "title": [], "arrows": []}
    with map_page(html, seen["errors"]) as page:
        seen["arrows"].append(page.evaluate(arrows))
        page.check("#lineage")
        page.wait_for_timeout(200)
        seen["arrows"].append(page.evaluate(arrows))
        page.select_option("#color-by", "lineage")
        for k, shot in enumerate(screenshots):
            page.select_option("#layout", str(k))
            page.wait_for_timeout(300)
            seen["positions"].append(page.evaluate(pos))
            seen["faithfulness"].append(page.inner_text("#faithfulness"))
            seen["title"].append(page.evaluate("() => document.querySelector('#map .gtitle').textContent"))
            seen["arrows"].append(page.evaluate(arrows))
            page.screenshot(path=str(shot))
        page.evaluate(f"() => Plotly.Fx.hover('map', [{{curveNumber: 1, pointNumber: {hover_index}}}])")
        page.wait_for_timeout(200)
        seen["hover"] = page.evaluate("() => document.querySelector('#map .hoverlayer').textContent")
    return seen


def inspect_categories(html: Path, screenshot: Path, *, field: str, hover_index: int, click_row: int) -> dict:
    """Colour the page by ``field`` and read back what says which point is which.

    Returns ``fills`` (each encoder marker's colour), ``rows`` (the legend: each row's text and
    swatch colour, as the browser computed both), ``hover`` (hover text of point ``hover_index``),
    ``ringed`` (markers ringed after a click on legend row ``click_row``), ``info``, ``errors``.
    """
    seen: dict = {"errors": []}
    with map_page(html, seen["errors"]) as page:
        page.select_option("#color-by", field)
        page.wait_for_timeout(300)
        seen["fills"] = page.evaluate(POINT_FILLS)
        seen["rows"] = page.evaluate("""() => [...document.querySelectorAll('#legend div')].map(r =>
            [r.textContent, getComputedStyle(r.querySelector('span.sw')).backgroundColor])""")
        page.evaluate(f"() => Plotly.Fx.hover('map', [{{curveNumber: 1, pointNumber: {hover_index}}}])")
        page.wait_for_timeout(200)
        seen["hover"] = page.evaluate("() => document.querySelector('#map .hoverlayer').textContent")
        page.locator("#legend div").nth(click_row).click()
        page.wait_for_timeout(300)
        seen["ringed"] = page.evaluate(
            "() => document.querySelectorAll('#map .scatterlayer .trace')[2].querySelectorAll('path.point').length")
        seen["info"] = page.inner_text("#info")
        page.screenshot(path=str(screenshot))
    return seen
