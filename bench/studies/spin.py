"""What ONNX Runtime's spinning workers cost the rest of the machine after each run.

    python -m bench.studies.spin [--model PATH] [--rows 1] [--tokens 12] [--runs 200]

Runs the exported text encoder with two intra-op threads, once per setting, and after
every run sleeps 5 ms while measuring this process's CPU time: with ONNX Runtime's
default spinning an idle worker keeps a core busy for those milliseconds, time the
tokenizer, Triton and the other encoder instances would otherwise get. Prints each
setting's run p50 and the CPU it burns while idle.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from bench.manifest import ROOT, TEXT_MODEL

SETTINGS = {
    "default spinning": {},
    "spin_duration_us 20": {"session.intra_op.spin_duration_us": "20"},
    "no spinning": {"session.intra_op.allow_spinning": "0"},
}


def measure(path: Path, config: dict[str, str], rows: int, tokens: int, runs: int):
    """(run p50 ms, mean CPU ms burnt during 5 ms of sleep after each run)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    ids = np.ones((rows, tokens), np.int64)
    feed = {"input_ids": ids, "attention_mask": ids, "token_type_ids": np.zeros_like(ids)}
    session.run(None, feed)
    latency, idle = [], []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        latency.append(time.perf_counter() - start)
        cpu = time.process_time()
        time.sleep(0.005)
        idle.append(time.process_time() - cpu)
    return statistics.median(latency) * 1e3, statistics.fmean(idle) * 1e3


def main(argv=None) -> int:
    """Print the table; returns 0."""
    default = ROOT / ".build" / "bench-repo" / f"{TEXT_MODEL}_encode" / "1" / "model.onnx"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=default)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args(argv)
    print(f"{args.rows} x {args.tokens} tokens, 2 intra-op threads, {args.runs} runs each")
    print(f"{'setting':22s} {'run p50 ms':>10s} {'CPU ms in 5 ms idle':>20s}")
    for _ in range(2):  # twice, interleaved: the second pass shows the noise
        for name, config in SETTINGS.items():
            p50, idle = measure(args.model, config, args.rows, args.tokens, args.runs)
            print(f"{name:22s} {p50:10.2f} {idle:20.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
