"""One-off studies behind figures quoted in the docs (``python -m bench.studies.<name>``).

Each answers one question with the core suite's parts (manifest, ceilings, loads); only
``precision`` runs in ``make bench``.
"""
