"""The ASGI edge: the WebSocket mode middleware (:mod:`.websocket`), the HTTP routes
(:mod:`.http_api`), the reference app (:mod:`.app`), the bridge to an existing app
(:mod:`.bridge`) and the host app's scope (:mod:`.host`). The only package (with ``server``
and ``testing``) that imports Starlette.
"""
