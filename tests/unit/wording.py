"""What a test asserts about a message: its key words, not its sentence (issue 53, section 6)."""

from __future__ import annotations


def says(text: str, *words: str) -> bool:
    """Assert that ``text`` holds every one of ``words`` (the node, the cause's numbers and names, the fix).

    Returns True so that it reads as ``assert says(result.message, "node2", "link 1", "42 replay")``; a missing word
    fails here, naming the words missing and the whole text, which an ``in`` chain would not show.
    """
    missing = [word for word in words if word not in text]
    assert not missing, f"{missing} not in {text!r}"
    return True
