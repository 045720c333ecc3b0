"""Serve-time logic of the Python-backend models.

Plain Python (numpy, tokenizers, onnxruntime, Pillow): nothing here imports
``triton_python_backend_utils``, so all of it is unit-tested without a server. The
generator copies this package next to each generated ``model.py``.
"""
