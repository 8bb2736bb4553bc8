"""One WebSocket connection's session (sans-I/O): its turns and connection cache
(:mod:`.session`), steering a running response (:mod:`.steering`), and the memory budget the
connections' caches share (:mod:`.budget`).
"""
