"""Why a model cannot be sized (`PlanError`, one line), and a value the user passed that names nothing the sizing
knows (`NotAllowed`: the command line to fix, exit 2)."""

from __future__ import annotations


class PlanError(Exception):
    """Why a model cannot be sized: one line."""


class NotAllowed(PlanError):
    """A value the user passed that names nothing `plan` knows: one line saying what is allowed, exit 2 (as
    argparse's own refusals), since it is the command line to fix, not the world."""
