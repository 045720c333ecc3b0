"""Studies of ``make bench``: a bare entry, precision knobs, model kinds.

``python -m bench.studies.<bare_entry|precision|model_kinds>``.
"""
