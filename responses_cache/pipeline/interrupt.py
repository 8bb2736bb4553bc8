"""A cooperative interrupt: the session asks a running response to stop at a safe boundary.

The session (sans-I/O) sets :attr:`Interrupt.requested` when steering input is accepted for an
active response; the pipeline checks it between backend events and, at the next safe boundary,
stops the backend stream (the engine sees an abort) and sets :attr:`Interrupt.taken`. Nothing here
waits or schedules: a flag set on one side, read on the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Interrupt:
    #: Steering input waits for this response: stop at the next safe boundary.
    requested: bool = False
    #: The pipeline stopped generation because of the request (the response ends ``steered``).
    taken: bool = False
