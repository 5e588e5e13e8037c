"""Stop strings, matched on the detokenised text in this one place (postprocessor and OpenAI server).

`push(delta)` returns the text that is safe to emit and whether a stop string was
reached. A stop string split over deltas is caught because the tail that could still
grow into one is held back: the longest suffix of the text that is a proper prefix of
some stop string (at most max(len(stop)) - 1 characters, and usually none, so ordinary
text is not delayed). The stop string and everything after it are never emitted, as
OpenAI's `stop` does. When several stop strings occur, the one that starts first wins
(ties: the earlier in the list); `matched` names it (vLLM's `stop_reason`). After a stop,
`push` returns ("", True): tokens the engine made before it heard of the stop are dropped.
"""

from __future__ import annotations

from typing import Sequence


class StopStringMatcher:
    def __init__(self, stop: Sequence[str] | None):
        stop = list(stop or ())
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop[{i}]: expected a non-empty string, got {s!r}")
        self._stops = tuple(dict.fromkeys(stop))  # duplicates removed, order kept
        self._held = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        return self._scan(self._held + text, at_end=False)

    def flush(self) -> str:
        """At the end of the output: the held tail, up to a stop string it may hold (see `stopped`)."""
        if self.stopped:
            return ""
        return self._scan(self._held, at_end=True)[0]

    def _scan(self, buffer: str, at_end: bool) -> tuple[str, bool]:
        first = min(((i, n) for n, s in enumerate(self._stops) if (i := buffer.find(s)) >= 0), default=None)
        wait = None if at_end else self._first_partial_stop(buffer, first)
        if first is not None and wait is None:
            start, n = first
            self.matched, self._held = self._stops[n], ""
            return buffer[:start], True
        cut = len(buffer) if wait is None else wait
        self._held = buffer[cut:]
        return buffer[:cut], False

    def _first_partial_stop(self, buffer: str, first: tuple[int, int] | None) -> int | None:
        """Where the earliest suffix of `buffer` starts that a longer stop string starts with, if that
        stop would win over the `first` complete match were it to complete; else None."""
        longest = max((len(s) for s in self._stops), default=1)
        for k in range(min(len(buffer), longest - 1), 0, -1):
            start, tail = len(buffer) - k, buffer[-k:]
            for n, s in enumerate(self._stops):
                if len(s) > k and s.startswith(tail) and (first is None or (start, n) < first):
                    return start
        return None
