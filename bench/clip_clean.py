"""What open_clip's exact text clean costs the CLIP tokenize step, in-process.

    .venv/bin/python -m bench.clip_clean [--batches 200] [--batch 64] [--repeats 3]
        [--replica-commit 9ab1dac]

Times the tokenize step's work on batches of ``--batch`` captions, the ways side by side
in rotation, each repeat the same batches:

- ``clean + tokenizer``: what the step runs now (``BatchTokenizer.clean``: ftfy,
  ``html.unescape`` twice, whitespace, lower, the refusal checks; then ``encode``);
- ``tokenizer alone``: the same ``tokenizer.json`` on the same texts, no clean (what the
  step would cost without cleaning; its ids are not open_clip's);
- ``replica`` (with ``--replica-commit``): the ``tokenizer.json`` served before issue
  49, whose normalizer replayed the clean, rebuilt from that commit's
  ``generator/families/open_clip/clean.py`` (``git show``; 9ab1dac is the last one).

Two caption sets: ``plain`` (the load corpus's varied sentences, ``client.load.corpus``)
and ``scraped`` (``generator.fixtures.caption_corpus``: entities, mojibake, markup,
emoji). Prints captions/s per way and set; the CLIP ``SimpleTokenizer``'s vocabulary,
context 77.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def _rate(encode, batches: list[list[str]]) -> float:
    start = time.perf_counter()
    for batch in batches:
        encode(batch)
    return sum(map(len, batches)) / (time.perf_counter() - start)


def _replica(commit: str, served: Path, out: Path) -> Path | None:
    """``served`` with the normalizer of ``commit``'s clean replica, written to ``out``."""
    import importlib.util
    import subprocess

    from tokenizers import Tokenizer, normalizers

    source = out.with_name("replica_clean.py")
    show = ["git", "show", f"{commit}:generator/families/open_clip/clean.py"]
    try:
        source.write_bytes(subprocess.run(show, check=True, capture_output=True).stdout)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"replica left out: no clean.py at {commit} here ({exc})")
        return None
    spec = importlib.util.spec_from_file_location("replica_clean", source)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    tokenizer = Tokenizer.from_file(str(served))
    quirk = normalizers.Replace("\u0345", " ")
    steps = [*old.basic_clean_steps(), quirk, *old.whitespace_steps(), *old.lower_steps()]
    tokenizer.normalizer = normalizers.Sequence(steps)
    out.write_text(tokenizer.to_str(), encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> None:
    """Print captions/s of each way on each caption set."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--replica-commit", help="a commit whose clean.py replays the clean")
    args = parser.parse_args(argv)

    import dataclasses

    from open_clip.tokenizer import SimpleTokenizer

    from client.load.corpus import varied_sentences
    from embed_runtime.text.tokenizer import BatchTokenizer
    from generator.families.open_clip.assets import write_tokenizer_json
    from generator.fixtures.caption_corpus import caption_corpus

    count = args.batches * args.batch
    sets = {
        "plain": varied_sentences(count, seed=0),
        "scraped": [t for t in caption_corpus(seed=0) if t.strip()],
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "tokenizer.json"
        params = write_tokenizer_json(SimpleTokenizer(), path, 77)
        served = BatchTokenizer(str(path), params)
        bare = BatchTokenizer(str(path), dataclasses.replace(params, text_clean=""))
        ways = {
            "clean + tokenizer": lambda texts: served.encode(served.clean(texts)),
            "tokenizer alone": bare.encode,
        }
        if args.replica_commit:
            replica = _replica(args.replica_commit, path, Path(tmp) / "replica.json")
            plain = dataclasses.replace(params, text_clean="", refused_code_points=())
            if replica is not None:
                ways["replica (before issue 49)"] = BatchTokenizer(str(replica), plain).encode
        rates: dict[tuple[str, str], list[float]] = {}
        for name, texts in sets.items():
            texts = (texts * (count // len(texts) + 1))[:count]
            batches = [texts[i : i + args.batch] for i in range(0, count, args.batch)]
            for _ in range(args.repeats):
                for way, encode in ways.items():
                    rates.setdefault((name, way), []).append(_rate(encode, batches))
    print(f"captions/s, batches of {args.batch}, best of {args.repeats} x {count} captions")
    print(f"{'set':<8} {'way':<28} {'captions/s':>11} {'vs alone':>9}")
    for (name, way), values in rates.items():
        best = max(values)
        ratio = best / max(rates[(name, "tokenizer alone")])
        print(f"{name:<8} {way:<28} {best:>11,.0f} {ratio:>8.2f}x")


if __name__ == "__main__":
    main()
