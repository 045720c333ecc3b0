"""The faults benchmarks: overload, memory soak, starts, plain and cancelling clients.

``python -m bench.faults.<overload|soak|start_loop|seed|cancels>``.
"""
