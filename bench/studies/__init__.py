"""Studies of ``make bench``: model kinds.

``python -m bench.studies.model_kinds``.
"""
