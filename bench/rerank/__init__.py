"""The rerank load, ``python -m bench.rerank``: its runner and its page section."""
