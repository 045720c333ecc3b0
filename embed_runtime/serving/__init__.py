"""The Triton-facing glue shared by the ``model.py`` adapters.

Reading requests, running them in one vectorised call, answering each (``pb_utils``
passed in), and the encode step that runs one engine.
"""
