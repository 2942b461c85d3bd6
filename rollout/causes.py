"""Why a verification failed, read from the failed predictions the canary's servers kept with their inputs
(serving/server/failures.py): the error messages and the input values most common among the failing requests."""
from __future__ import annotations

import collections
import json
from typing import Any

from rollout.backends import Backend

MAX_MESSAGES = 3
MAX_VALUES = 5
# A value is named when at least this share of the failing requests (and two of them) carry it.
MIN_VALUE_SHARE = 0.5
# A message or value in the console line; the state and the report keep them whole.
SHOWN_CHARS = 160


def summarize_failures(failures: list[dict[str, Any]], traffic: str) -> dict[str, Any]:
    """The failures of `traffic` ("users" or "verifier"): how many, their commonest messages, and the input values
    that at least MIN_VALUE_SHARE of them (and two) carry, each counted once per request."""
    chosen = [f for f in failures if f.get("traffic") == traffic]
    messages = collections.Counter(str(f.get("message", "")) for f in chosen)
    values: collections.Counter[tuple[str, str]] = collections.Counter()
    for failure in chosen:
        values.update({(name, json.dumps(value, sort_keys=True))
                       for row in failure.get("rows") or [] for name, value in row.items()})
    count = len(chosen)
    common = sorted(((n, name, value) for (name, value), n in values.items()
                     if n >= 2 and n >= MIN_VALUE_SHARE * count), key=lambda t: (-t[0], t[1], t[2]))
    return {
        "traffic": traffic,
        "failed_requests": count,
        "messages": [{"message": m, "count": n}
                     for m, n in sorted(messages.items(), key=lambda t: (-t[1], t[0]))[:MAX_MESSAGES]],
        "values": [{"feature": name, "value": json.loads(value), "count": n} for n, name, value in common[:MAX_VALUES]],
    }


def failure_causes(backend: Backend, model: str, version: int, since: float, traffic: str) -> dict[str, Any]:
    """The causes of the failures the canary track's servers kept for `version` since `since` (seconds since 1970);
    servers that could not be read are named under `unread`."""
    try:
        failures, unread = backend.failures(model, "canary", version, since)
    except Exception as e:  # noqa: BLE001 - the causes inform; they must never keep a failed step from rolling back
        failures, unread = [], [f"the canary's servers could not be listed ({type(e).__name__}: {e})"]
    causes = summarize_failures(failures, traffic)
    if unread:
        causes["unread"] = unread
    return causes


def _short(text: str) -> str:
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def describe_causes(causes: dict[str, Any]) -> str:
    """One line for the console: the messages with their counts, then the common values."""
    count = causes["failed_requests"]
    whose = "users'" if causes["traffic"] == "users" else "the verifier's"
    if not count:
        text = f"the canary's servers kept none of the {whose} failed requests"
    else:
        text = f"{count} of the {whose} failed requests kept: " + "; ".join(
            f"{m['count']}x {_short(m['message'])!r}" for m in causes["messages"])
        if causes["values"]:
            text += "; common to them: " + ", ".join(
                f"{v['feature']}={_short(json.dumps(v['value']))} ({v['count']} of {count})" for v in causes["values"])
    if causes.get("unread"):
        text += f" (not read: {'; '.join(causes['unread'])})"
    return text
