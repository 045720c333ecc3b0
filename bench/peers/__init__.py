"""Peer services the benchmark compares Triton against, run as subprocesses."""
