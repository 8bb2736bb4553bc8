"""What serves a request whatever the transport: the :class:`~.runtime.Service` a host app mounts
(:mod:`.runtime`), the :class:`~.responder.Responder` that finds a turn's parent and runs it
(:mod:`.responder`), background responses (:mod:`.background`), lifecycle and drains
(:mod:`.lifecycle`), authentication (:mod:`.auth`). No ASGI framework here.
"""
