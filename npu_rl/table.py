"""Plain-text tables for the CLIs' summaries, and the README's generated tables (between markers)."""

from collections.abc import Sequence


def format_table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; the first line is ``head``."""
    table = [list(map(str, head))] + [list(map(str, r)) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table)


def splice_table(text: str, name: str, block: str) -> str:
    """Replace the lines between ``<!-- NAME-table:begin -->`` and ``<!-- NAME-table:end -->``.

    Raises:
        KeyError: the marker pair is missing or doubled (the message names it).
    """
    begin, end = f"<!-- {name}-table:begin -->\n", f"\n<!-- {name}-table:end -->"
    if text.count(begin) != 1 or text.count(end.strip()) != 1 or end not in text.split(begin, 1)[1]:
        raise KeyError(f"README.md must hold exactly one '{begin.strip()}' ... '{end.strip()}' pair")
    head, rest = text.split(begin, 1)
    _old, tail = rest.split(end, 1)
    return f"{head}{begin}{block}{end}{tail}"
