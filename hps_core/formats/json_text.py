"""What to say about a JSON file that does not parse: the two mistakes hand-edited HugeCTR
files (ps.json, network JSON) make most, which Python's parser reports only as the character
it did not expect."""

from __future__ import annotations


def json_syntax_hint(text: str, pos: int) -> str:
    """A hint for a ``json.JSONDecodeError`` at ``pos`` of ``text``, or ``""``.

    Example:
        >>> json_syntax_hint('{"a": 1,}', 8)
        ' (trailing comma before it; remove the comma)'
        >>> json_syntax_hint('{// note\\n}', 1)
        ' (JSON has no comments; remove them)'
    """
    if text.startswith(("//", "/*"), pos):
        return " (JSON has no comments; remove them)"
    before = text[:pos].rstrip()
    if before.endswith(",") and text[pos : pos + 1] in ("}", "]"):
        return " (trailing comma before it; remove the comma)"
    return ""
