"""Request-path image handling: decode and preprocess, on the CPU or the GPU.

open_clip's transform is reproduced exactly (``preprocess``, ``gpu``).
"""
