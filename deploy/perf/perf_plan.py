"""What ``run_perf.sh`` profiles: every ready ensemble of a server, with its input data.

    python3 deploy/perf/perf_plan.py --url triton:8000 --out DIR [--models "a b"]

Asks the server (HTTP, standard library) for its loaded models through the statistics
and metadata endpoints (open to all; the repository index and model configs need the
admin key), keeps the ensembles and reads each one's public input (``TEXT``, ``IMAGE``
or ``IMAGE_URL``), writes the perf_analyzer ``--input-data`` files with
:mod:`client.load.perf_data` into ``DIR``, and prints one ``<ensemble><TAB><data file>`` line
per ensemble. ``IMAGE_URL`` ensembles get ``data:`` URIs of the same photos, so the URL
path is measured without a web server or an ``allow_hosts`` change (the fetch itself is
then local).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA_FILES = {"TEXT": "text.json", "IMAGE": "image.json", "IMAGE_URL": "image_url_data.json"}
MIME = {".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}


def _get(url: str, body: dict | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")  # noqa: S310
    with urllib.request.urlopen(request, timeout=30) as resp:  # noqa: S310 - the server's URL
        return json.loads(resp.read())


def ready_ensembles(http_url: str) -> dict[str, str]:
    """``{ensemble: public input name}`` for every ready ensemble of the server."""
    base = http_url if "://" in http_url else f"http://{http_url}"
    stats = _get(f"{base}/v2/models/stats")
    out = {}
    for name in sorted({m["name"] for m in stats.get("model_stats", [])}):
        meta = _get(f"{base}/v2/models/{name}")
        inputs = [i["name"] for i in meta.get("inputs", [])]
        if meta.get("platform") == "ensemble" and len(inputs) == 1 and inputs[0] in DATA_FILES:
            out[name] = inputs[0]
    return out


def data_uri_entries(images: Path) -> list[dict]:
    """``IMAGE_URL`` entries carrying each photo of ``images`` as a ``data:`` URI."""
    entries = []
    for path in sorted(p for p in images.iterdir() if p.suffix.lower() in MIME):
        payload = base64.b64encode(path.read_bytes()).decode()
        uri = f"data:{MIME[path.suffix.lower()]};base64,{payload}"
        entries.append({"IMAGE_URL": {"content": [uri], "shape": [1]}})
    return entries


def write_data(out: Path, kinds: set[str]) -> dict[str, Path]:
    """Write the input-data files the ``kinds`` (public input names) need."""
    sys.path.insert(0, str(HERE.parent.parent))
    from client.load.perf_data import write_perf_data  # noqa: PLC0415 - after the path is set

    write_perf_data(out, "clip" if kinds & {"IMAGE", "IMAGE_URL"} else "text")
    if "IMAGE_URL" in kinds:
        entries = data_uri_entries(out / "images")
        (out / DATA_FILES["IMAGE_URL"]).write_text(json.dumps({"data": entries}) + "\n")
    return {kind: out / DATA_FILES[kind] for kind in kinds}


def main(argv: list[str] | None = None) -> int:
    """Print the plan; exit 2 when there is nothing to profile."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="Triton HTTP host:port")
    parser.add_argument("--out", required=True, type=Path, help="folder for the data files")
    parser.add_argument("--models", default="", help="space-separated ensembles (default: all)")
    args = parser.parse_args(argv)
    try:
        ensembles = ready_ensembles(args.url)
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        print(
            f"error: no Triton answers at {args.url} ({reason}): start it first, e.g. `make serve`",
            file=sys.stderr,
        )
        return 2
    wanted = args.models.split()
    unknown = sorted(set(wanted) - set(ensembles))
    if unknown:
        print(f"error: not ready ensembles: {unknown}; ready: {sorted(ensembles)}", file=sys.stderr)
        return 2
    chosen = {m: ensembles[m] for m in (wanted or ensembles)}
    if not chosen:
        print("error: the server has no ready ensemble", file=sys.stderr)
        return 2
    files = write_data(args.out, set(chosen.values()))
    for model, kind in chosen.items():
        print(f"{model}\t{files[kind]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
