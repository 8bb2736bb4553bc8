"""What the server keeps about responses: a response's state (:mod:`.state`), the process-wide
hot cache (:mod:`.hot`), the durable store (:mod:`.store`, :mod:`.redis_store` over
:mod:`.redis_client`), items by id (:mod:`.references`) and listings (:mod:`.listing`).
"""
