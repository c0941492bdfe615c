"""A key's budget, written after its key in VL_API_KEYS: `alice:KEY:5usd/day`, `bob:KEY:2Mtokens/month`.

Tokens are what the engine computed for the key: prompt tokens not read from its cache, and generated ones (a
cached read costs the GPU next to nothing). Dollars are the key's share of the engine's busy time at
VL_COST_PER_HOUR, as the console prices it. Periods are UTC calendar ones: a day from midnight, a week from
Monday, a month from its first day; a budget is whole again when its period ends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

BUDGET = re.compile(r"(\d{1,15}(?:\.\d{1,6})?)([kM]?)(tokens|usd)/(day|week|month)")
SCALES = {"": 1, "k": 1_000, "M": 1_000_000}
PERIODS = {"day": "daily", "week": "weekly", "month": "monthly"}  # Claude Code's word for each (overage-period)
UNITS = ("tokens", "usd")
BUDGET_FORM = "`<amount>tokens/<period>` or `<amount>usd/<period>` (period: day, week or month; 2Mtokens, 500ktokens)"


@dataclass(frozen=True)
class Budget:
    """At most `limit` tokens or dollars (`unit`) per UTC day, week or month (`period`)."""

    limit: float
    unit: str
    period: str

    def __str__(self) -> str:
        """As the console and the refusal say it: `$5.00 a day`, `2,000,000 tokens a month`."""
        amount = f"${self.limit:,.2f}" if self.unit == "usd" else f"{self.limit:,.0f} tokens"
        return f"{amount} a {self.period}"

    @property
    def entry(self) -> str:
        """As VL_API_KEYS writes it (the inverse of `budget`)."""
        amount = f"{self.limit:.6f}".rstrip("0").rstrip(".")  # never `1e+06`, which `budget` would not read
        return f"{amount}{self.unit}/{self.period}"

    def began(self, now: datetime) -> datetime:
        """When the period `now` falls in began (UTC midnight of its first day)."""
        midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
        if self.period == "week":
            return midnight - timedelta(days=midnight.weekday())
        if self.period == "month":
            return midnight.replace(day=1)
        return midnight

    def resets(self, now: datetime) -> datetime:
        """When the period `now` falls in ends, and the budget is whole again."""
        began = self.began(now)
        if self.period == "month":
            return began.replace(year=began.year + began.month // 12, month=began.month % 12 + 1)
        return began + timedelta(days=7 if self.period == "week" else 1)


def budget(text: str) -> Budget | None:
    """`5usd/day`, `2Mtokens/month`… as a Budget; None for text that is not one (a key's last part, say)."""
    written = BUDGET.fullmatch(text)
    if written is None:
        return None
    amount, scale, unit, period = written.groups()
    return Budget(float(amount) * SCALES[scale], unit, period)
