"""The turn pipeline and its stages (no sockets, no ASGI)."""

from .hooks import Flag, Hook, HookContext, HookRunner, Verdict
from .pipeline import Pipeline
from .turn import Turn
from .validate import Limits, Validator

__all__ = ["Flag", "Hook", "HookContext", "HookRunner", "Limits", "Pipeline", "Turn", "Validator", "Verdict"]
