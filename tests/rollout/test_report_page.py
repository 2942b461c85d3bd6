"""The rollout page's traffic chart: clock-time axis, and step labels that never overlap, measured in chromium."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from rollout.report import _LABEL_CHAR_PX, clock_ticks, label_rows, render_html
from tests.browser import render

T0 = 1_796_000_000.0  # 2026-11-30T00:53:20Z


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def record_with_windows(offsets: list[tuple[float, int, bool]], end: float) -> dict:
    """A rollout whose verifications ended at T0 + offset (weight, failed) and that finished at T0 + end."""
    events = [{"at": stamp(T0 + at), "phase": "verify", "next": "step", "message": "",
               "figures": {"weight": weight, **({"error": "error rate 0.2 > rollout.max_error_rate 0.01"}
                                                if failed else {})}} for at, weight, failed in offsets]
    return {"model": "taxi", "candidate": 2, "stable": 1, "id": "r1", "steps": [10, 50, 100],
            "started_at": stamp(T0), "finished_at": stamp(T0 + end),
            "outcome": "rolled_back" if any(f for _, _, f in offsets) else "promoted", "events": events}


def traffic(seconds: int) -> dict:
    times = [T0 + i for i in range(seconds + 1)]
    figures = {"user_requests_per_second": [5.0] * len(times), "error_rate": [0.0] * len(times),
               "verifier_requests_per_second": [1.0] * len(times), "p99_ms": [12.0] * len(times)}
    return {"times": times, "tracks": {"stable": figures, "canary": dict(figures)}}


# Appended to a copy of the page: the browser's own text boxes of every marker label, per chart.
MEASURE = """<script>
const out = {};
for (const svg of document.querySelectorAll('svg[data-chart]')) {
  const labels = [...svg.querySelectorAll('text[data-marker]')].map(t => {
    const b = t.getBBox(); return {text: t.textContent, x: b.x, y: b.y, w: b.width, h: b.height};
  });
  out[svg.dataset.chart] = {width: svg.width.baseVal.value, labels};
}
const pre = document.createElement('pre'); pre.id = 'measured'; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script>"""


def measured(tmp_path: Path, page: str) -> dict:
    path = tmp_path / "page.html"
    path.write_text(page.replace("</body>", MEASURE + "</body>"))
    rendered = render(path)
    assert rendered.console == []
    found = re.search(r'<pre id="measured">(.*?)</pre>', rendered.dom, re.S)
    assert found, "the measuring script ran"
    return json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))


def overlapping(labels: list[dict]) -> list[tuple[str, str]]:
    return [(a["text"], b["text"]) for i, a in enumerate(labels) for b in labels[i + 1:]
            if a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]]


def test_step_labels_close_together_stack_instead_of_overlapping_in_a_browser(tmp_path):
    # Three verifications a second apart on a 10-minute chart, then the verdict: the labels would share 20 pixels.
    record = record_with_windows([(100, 10, False), (101, 10, False), (102, 50, True)], end=103)
    charts = measured(tmp_path, render_html(record, traffic(600)))
    assert set(charts) == {"traffic-user_requests_per_second", "traffic-error_rate",
                           "traffic-verifier_requests_per_second", "traffic-p99_ms"}
    for chart in charts.values():
        labels = chart["labels"]
        assert [label["text"] for label in labels] == ["10% verified, to 50%", "10% verified, to 50%",
                                                       "50% failed", "ROLLED BACK"]
        assert overlapping(labels) == []
        assert len({label["y"] for label in labels}) == 4, "four rows"
        for label in labels:
            assert label["w"] <= len(label["text"]) * _LABEL_CHAR_PX, "the layout's width estimate is on the wide side"
            assert 0 <= label["x"] and label["x"] + label["w"] <= chart["width"]


def test_labels_far_apart_share_one_row_and_the_last_ends_at_its_line(tmp_path):
    record = record_with_windows([(100, 10, False), (250, 50, False), (400, 100, False)], end=600)
    charts = measured(tmp_path, render_html(record, traffic(600)))
    labels = charts["traffic-error_rate"]["labels"]
    assert [label["text"] for label in labels] == ["10% verified, to 50%", "50% verified, to 100%",
                                                   "100% verified, promote", "PROMOTED"]
    assert len({label["y"] for label in labels}) == 1 and overlapping(labels) == []
    assert labels[-1]["x"] + labels[-1]["w"] <= charts["traffic-error_rate"]["width"], "inside the chart"


def test_the_axis_is_clock_time():
    page = render_html(record_with_windows([(100, 10, False)], end=600), traffic(600))
    ticks = re.findall(r'data-tick="(\d+)">(\d\d:\d\d:\d\d)<', page)
    # 600 s: a tick every 2 minutes, on the minute, in each of the four panels.
    assert ticks[:5] == [("1796000040", "00:54:00"), ("1796000160", "00:56:00"), ("1796000280", "00:58:00"),
                         ("1796000400", "01:00:00"), ("1796000520", "01:02:00")]
    assert len(ticks) == 20 and page.count(">UTC</text>") == 4
    assert " s</text>" not in page, "no seconds from the start"


@pytest.mark.parametrize("gap, rows", [(4.0, [0, 0]), (4.1, [0, 1])])
def test_a_label_goes_to_the_next_row_only_when_it_comes_closer_than_the_gap(gap, rows):
    assert label_rows([(0.0, 10.0), (14.0, 30.0)], gap=gap) == rows


def test_a_label_takes_the_first_row_with_room():
    assert label_rows([(0, 50), (10, 60), (20, 70), (55, 100), (66, 120)]) == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("t0, t1, step", [(T0, T0 + 7, 1), (T0, T0 + 8, 2), (T0, T0 + 600, 120),
                                          (T0, T0 + 3600, 600)])
def test_clock_ticks_are_round_and_at_most_eight(t0, t1, step):
    ticks = clock_ticks(t0, t1)
    assert 1 <= len(ticks) <= 8 and all(t % step == 0 for t in ticks) and ticks == sorted(ticks)
    assert all(b - a == step for a, b in zip(ticks, ticks[1:], strict=False))
    assert t0 <= ticks[0] < t0 + step and t1 - step < ticks[-1] <= t1
