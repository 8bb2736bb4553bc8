"""The turn pipeline and its stages (no sockets, no ASGI)."""

from .hooks import Flag, Hook, HookContext, HookRunner, Verdict
from .pipeline import Pipeline
from .run import TurnRun
from .turn import Lineage, Turn
from .validate import Limits, Validator

__all__ = [
    "Flag",
    "Hook",
    "HookContext",
    "HookRunner",
    "Limits",
    "Lineage",
    "Pipeline",
    "Turn",
    "TurnRun",
    "Validator",
    "Verdict",
]
