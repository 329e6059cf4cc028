"""'Did you mean' suggestions for misspelt names."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate most like `word`, if any is close enough to be a plausible typo."""
    options = list(candidates)
    matches = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    lowered = {c.lower(): c for c in options}
    return lowered.get(word.lower())


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean X?)' or an empty string."""
    match = closest(word, candidates)
    return f" (did you mean {match!r}?)" if match else ""
