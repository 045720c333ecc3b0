"""The faults benchmarks: overload, memory soak, plain and cancelling clients.

``python -m bench.faults.<overload|soak|seed|cancels>``.
"""
