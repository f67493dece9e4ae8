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

from reports import files

PAGE = 4096


def load_events(path: str, tool: str) -> list[dict]:
    """The file's traceEvents; a file cut at a page boundary without its partial last event (said
    on stderr, naming `tool`). Raises OSError, ValueError or KeyError on a file that is neither;
    files.FileRefused (an OSError) on one that is not a regular file of at most
    files.TIMELINE_LIMIT bytes, or not UTF-8."""
    data = files.read_bytes(path, "timeline", files.TIMELINE_LIMIT)
    try:
        return json.loads(files.decode(data, path, "timeline"))["traceEvents"]
    except (ValueError, files.NotUtf8):
        # Judged on the bytes: the cut may fall inside a character, which the events kept do not.
        content = data.rstrip(b" ")
        last = content.rfind(b",\n{")
        if not content or len(content) % PAGE != 0 or last < 0:
            raise
        events = json.loads(files.decode(content[:last], path, "timeline") + "\n]}\n")["traceEvents"]
        print(
            f"{tool}: {path} was cut at byte {len(content)} (a page boundary: its writer was killed "
            "mid-write); read without its partial last event",
            file=sys.stderr,
        )
        return events
