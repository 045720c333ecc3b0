"""The engines of the encode steps and what they run on.

The contract (``Engine``), the ONNX Runtime session, ragged batching, and each kind of
answer: dense, text, multi-vector, sparse, routed sparse, quantized forms.
"""
