"""Serve-time logic of the Python-backend models.

Plain Python (numpy, tokenizers, onnxruntime, Pillow): nothing here imports
``triton_python_backend_utils``, so all of it is unit-tested without a server. The
generator copies this package next to each generated ``model.py``.

The request path: ``serving`` (what every adapter shares, and the encode step),
``engines`` (the engine contract and each engine, the ONNX Runtime session), ``text``
(tokenizers, request options), ``image`` (decode, preprocess) and ``fetch`` (image
URLs). Operations, beside it: ``ops`` (stub watch, health probe, busy board, weight
cache, integrity digests). ``steps`` declares the adapters of ``models/``;
``config_params`` and ``errors`` serve all of them.
"""
