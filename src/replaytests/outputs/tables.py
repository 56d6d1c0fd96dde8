"""Tables as the outputs show them: one Table, rendered as fixed-width text (terminal), Markdown and
HTML, and the cell formats every output shares (proportions with their interval, numbers)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from replaytests.errors import CONTROL

if TYPE_CHECKING:  # stats imports numpy, which a table does not need
    from replaytests.outputs.stats import Proportion


def first(items: list[str], n: int = 5) -> str:
    """The first `n` items, comma-separated, and `...` where there are more."""
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


@dataclass(frozen=True)
class Table:
    title: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def fmt_proportion(p: Proportion | None) -> str:
    """`k/n = rate% [low, high]` of a Wilson proportion (stats.proportion), `-` where there is none."""
    if p is None:
        return "-"
    if p.n == 0:
        return "0/0"
    return f"{p.k}/{p.n} = {100 * p.rate:.1f}% [{100 * p.ci_low:.1f}, {100 * p.ci_high:.1f}]"


def fmt_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def plain(table: Table) -> str:
    """A table as fixed-width text for a terminal."""
    rows = [table.header, *table.rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(table.header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


_TAG = re.compile(r"<(?=[A-Za-z/!?])")  # what would open raw HTML in Markdown (`R<-D` stays as written)


def md_cell(text: str) -> str:
    """Text as Markdown shows it literally, inside a table cell or a list item: a `|` or a backslash is not
    syntax, a control character or a newline is a space, and `<script>` or `<img onerror=...>` from a
    contract name, a row id or a path is text, never HTML."""
    text = text.replace("\\", "\\\\").replace("|", "\\|")
    return _TAG.sub("&lt;", CONTROL.sub(" ", text))


def markdown(table: Table, level: int = 3) -> list[str]:
    """A table as Markdown lines: its title as a heading of `level` (none at 0), the table, its note."""
    lines = [f"{'#' * level} {md_cell(table.title)}", ""] if level and table.title else []
    lines += ["| " + " | ".join(map(md_cell, table.header)) + " |", "|" + "---|" * len(table.header)]
    lines += ["| " + " | ".join(map(md_cell, row)) + " |" for row in table.rows]
    return lines + (["", md_cell(table.note), ""] if table.note else [""])


LONG = 48  # characters: a longer cell (a sentence, a list) may wrap; shorter ones never do


def html(table: Table, level: int = 3) -> str:
    """A table as HTML in a scrolling box (short cells never wrap), its title as a heading of `level`."""
    head = "".join(f"<th>{escape(h)}</th>" for h in table.header)
    rows = "".join("<tr>" + "".join(f"<td{' class=long' if len(c) > LONG else ''}>{escape(c)}</td>" for c in row)
                   + "</tr>" for row in table.rows)
    note = f'<p class="note">{escape(table.note)}</p>' if table.note else ""
    title = f"<h{level}>{escape(table.title)}</h{level}>" if level and table.title else ""
    return f'{title}<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>{note}'
