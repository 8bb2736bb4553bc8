"""The ``responses-cache serve`` process: the command line (:mod:`.cli`), its settings file
(:mod:`.settings`) and uvicorn's configuration (:mod:`.serving`).
"""
