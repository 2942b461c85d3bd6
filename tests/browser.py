"""Debian's headless chromium for page tests: the DOM after load and every console message, no network."""
from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# Flags that work on a closed network: nothing is fetched, synced or updated, and no first-run UI.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0"]
# chromium logs each console message (console.* calls, uncaught errors, failed loads) as `...:CONSOLE(...)] "..."`.
CONSOLE_LINE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


@dataclass
class Rendered:
    dom: str
    console: list[str]
    # Element id -> tag of every element with an id, and data-chart -> how many charts carry that name.
    ids: dict[str, str]
    charts: dict[str, int]


class _Elements(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}
        self.charts: dict[str, int] = {}
        self.sources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if values.get("id"):
            self.ids[values["id"]] = tag
        if values.get("data-chart"):
            self.charts[values["data-chart"]] = self.charts.get(values["data-chart"], 0) + 1
        for name in ("src", "href"):
            if values.get(name):
                self.sources.append(values[name])


def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make setup` as root, or `sudo apt-get install chromium`.")
    return CHROMIUM


def render(page: Path | str, screenshot: Path | None = None, timeout_s: float = 90,
           flags: tuple[str, ...] = ()) -> Rendered:
    """Loads `page` (a file, or a URL such as a loopback server's) in headless chromium with a fresh profile; its DOM
    after load and its console messages. `flags` go to chromium as well (--virtual-time-budget=MS lets the page's
    timers and workers run that long before the DOM is read)."""
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        extra = [f"--screenshot={screenshot}", "--window-size=1200,4000"] if screenshot else ["--dump-dom"]
        done = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *flags, *extra,
                               page if isinstance(page, str) else page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise AssertionError(f"chromium exited with {done.returncode}: {done.stderr[-2000:]}")
    console = [m.group(1) for m in map(CONSOLE_LINE.search, done.stderr.splitlines()) if m]
    elements = _Elements()
    elements.feed(done.stdout)
    outside = [s for s in elements.sources if re.match(r"(https?:)?//", s)]
    if outside:
        console.append(f"the page loads from the network: {outside}")
    return Rendered(done.stdout, console, elements.ids, elements.charts)
