"""The table commands' one layout (`plan`, `pod status`, `pod gpus`): rows as columns two spaces apart."""

from __future__ import annotations

from collections.abc import Sequence


def print_columns(rows: Sequence[Sequence[str]]) -> None:
    """Rows as columns two spaces apart, the last one unpadded: the table commands' one layout."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
