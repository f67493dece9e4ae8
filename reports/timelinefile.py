"""Reading kolo's timeline files (Chrome trace JSON), as scripts/timeline-merge and
scripts/timeline-overlap do: standard library only, so that those scripts run under any python3.

A rank killed while its timeline was being written leaves a file that parses, or, rarely, one
whose last write was cut at a page boundary: the file holds what was written up to that boundary,
then the spaces reserved ahead. Such a file is read without its partial last event, and said so; a
file cut anywhere else is refused.
"""

from __future__ import annotations

import json
import sys

PAGE = 4096


def load_events(path: str, tool: str) -> list[dict]:
    """The file's traceEvents; a file cut at a page boundary without its partial last event (said
    on stderr, naming `tool`). Raises OSError, ValueError or KeyError on a file that is neither."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)["traceEvents"]
    except ValueError:
        content = text.rstrip(" ")
        last = content.rfind(",\n{")
        if not content or len(content) % PAGE != 0 or last < 0:
            raise
        events = json.loads(content[:last] + "\n]}\n")["traceEvents"]
        print(
            f"{tool}: {path} was cut at byte {len(content)} (a page boundary: its writer was killed "
            "mid-write); read without its partial last event",
            file=sys.stderr,
        )
        return events
