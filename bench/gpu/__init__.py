"""The GPU benchmark, ``python -m bench.gpu`` (a CUDA host with onnxruntime-gpu).

The runner, the GPU image checks, the in-process rates, and the "GPU" section of
``docs/benchmarks.md``.
"""
