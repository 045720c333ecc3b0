"""GPU image decode in ``bench.gpu`` (``--set clip.image_decode=gpu``): parity, rate, safety.

Photos in many encodings through the exact CPU path and the GPU path, embedded by the served
image tower on CUDA; the GPU path's rate; corrupt JPEGs failing alone; stub GPU memory.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from PIL import Image

from bench.ceiling import config_parameters, make_session
from bench.gpu.rates import step_onnx
from client.load.perf_data import image_entries, url_entries
from embed_runtime.image.gpu import GpuPreprocessor, gpu_eligible, nvimgcodec_decoder
from embed_runtime.image.preprocess import PreprocessParams, open_image, preprocess_opened

SKIMAGE_PHOTOS = (
    "astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
    "retina", "colorwheel", "brick", "grass", "gravel", "camera", "coins", "moon", "page",
    "text",
)
CLIP_MODEL = "clip-vit-b-32"  # the name bench.gpu serves its ViT-B-32 under
DECODER_OPTIONS = {"default": "", "fancy_upsampling": ":fancy_upsampling=1"}


def parity_photos() -> dict[str, bytes]:
    """Encoded photographs for the parity table (name -> file bytes)."""
    from skimage import data

    photos: dict[str, bytes] = {}

    def save(name: str, image, fmt: str, **kwargs) -> None:
        buf = io.BytesIO()
        image.save(buf, format=fmt, **kwargs)
        photos[name] = buf.getvalue()

    for name in SKIMAGE_PHOTOS:
        try:
            array = getattr(data, name)()
        except Exception:  # noqa: BLE001 - a photo the installed wheel lacks is skipped
            continue
        if array.dtype != np.uint8 or array.ndim not in (2, 3):
            continue
        image = Image.fromarray(array[..., :3] if array.ndim == 3 else array)
        save(f"{name}_q90.jpg", image, "JPEG", quality=90)
        if image.mode == "RGB":
            save(f"{name}_q95_444.jpg", image, "JPEG", quality=95, subsampling=0)
            save(f"{name}_progressive.jpg", image, "JPEG", quality=85, progressive=True)
    astronaut = Image.fromarray(data.astronaut())
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: the served path applies EXIF orientation on both paths
    save("astronaut_exif6.jpg", astronaut, "JPEG", quality=90, exif=exif)
    save("astronaut.png", astronaut, "PNG")
    save("astronaut.webp", astronaut, "WEBP", quality=90)
    save("astronaut.gif", astronaut.convert("P"), "GIF")
    save("astronaut.tiff", astronaut, "TIFF")
    return photos


def _levels(pixels: np.ndarray, params) -> np.ndarray:
    """Normalised float32 [3, H, W] back to 8-bit levels."""
    mean = np.asarray(params.mean, dtype=np.float64)[:, None, None]
    std = np.asarray(params.std, dtype=np.float64)[:, None, None]
    return (pixels.astype(np.float64) * std + mean) * 255.0


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of ``a`` with the same row of ``b``, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def embed_one(client, model: str, name: str, data: bytes) -> np.ndarray:
    """``EMBEDDING`` of ``model`` for one ``[1, 1]`` BYTES input ``name`` (a gRPC client)."""
    item = grpcclient.InferInput(name, [1, 1], "BYTES")
    item.set_data_from_numpy(np.array([[data]], dtype=object))
    return client.infer(model, [item]).as_numpy("EMBEDDING")


def _preprocessed(datas: list[bytes], params) -> np.ndarray:
    """The exact CPU path's pixels of each image, stacked."""
    return np.stack([preprocess_opened(open_image(d, params), params) for d in datas])


def _embed(session, pixels: np.ndarray) -> np.ndarray:
    name = session.get_inputs()[0].name
    return np.concatenate([session.run(None, {name: pixels[i : i + 32]})[0]
                           for i in range(0, len(pixels), 32)])


def image_parity(onnx_path: Path, params, photos: dict[str, bytes]) -> dict:
    """Exact CPU path vs GPU path (each decoder option) vs draft decode, per photo."""
    import torch

    session = make_session(onnx_path, "gpu")
    names, datas = list(photos), list(photos.values())
    exact_params = dataclasses.replace(params, image_decode="cpu")
    exact = _preprocessed(datas, exact_params)
    draft = _preprocessed(datas, dataclasses.replace(exact_params, draft_decode=True))
    reference = _embed(session, exact)
    paths = {"draft_cpu": draft}
    device = torch.device("cuda", 0)
    errors = {}
    for label, options in DECODER_OPTIONS.items():
        try:
            decode = nvimgcodec_decoder(0, params.apply_exif, options)
            gpu = GpuPreprocessor(params, torch, device, decode)
            out = gpu.run([open_image(d, params) for d in datas], datas)
            failed = [n for n, r in zip(names, out, strict=True) if isinstance(r, Exception)]
            if failed:
                raise RuntimeError(f"GPU path failed on {failed}: {out}")
            paths[f"gpu_{label}"] = np.stack([r.cpu().numpy() for r in out])
        except Exception as exc:  # noqa: BLE001 - recorded; the other option still runs
            errors[label] = f"{type(exc).__name__}: {exc}"[:500]
    rows = []
    embeddings = {label: _embed(session, pixels) for label, pixels in paths.items()}
    cosines = {label: cosine_rows(reference, emb) for label, emb in embeddings.items()}
    for i, name in enumerate(names):
        row = {"photo": name, "size": list(open_image(photos[name], params).size),
               "gpu_decoded": gpu_eligible(open_image(photos[name], params), photos[name])}
        for label, pixels in paths.items():
            diff = np.abs(_levels(pixels[i], params) - _levels(exact[i], params))
            row[label] = {"cosine": float(cosines[label][i]), "max_levels": float(diff.max()),
                          "mean_levels": float(diff.mean())}
        rows.append(row)
    summary = {label: {"min_cosine": float(c.min()), "mean_cosine": float(c.mean())}
               for label, c in cosines.items()}
    return {"photos": rows, "summary": summary, "errors": errors,
            "reference": "exact CPU path, same graph"}


def served_image_parity(grpc_url: str, model: str, photos: dict[str, bytes],
                        onnx_path: Path, params) -> dict:
    """The served ``<model>`` (GPU decode) against the exact CPU path embedded in-process."""
    client = grpcclient.InferenceServerClient(grpc_url)
    served = [embed_one(client, model, "IMAGE", data)[0] for data in photos.values()]
    exact = _preprocessed(list(photos.values()), params)
    cosine = cosine_rows(np.asarray(served), _embed(make_session(onnx_path, "gpu"), exact))
    return {"photos": len(photos), "min_cosine": float(cosine.min()),
            "mean_cosine": float(cosine.mean())}


def gpu_preprocess_rate(params, photos: dict[str, bytes], seconds: float = 5.0,
                        batch: int = 64, options: str | None = None) -> dict:
    """Images/s of the GPU path in one process, batches of ``batch`` of ``photos``."""
    import torch

    pool = ThreadPoolExecutor(2)
    decode = (nvimgcodec_decoder(0, params.apply_exif) if options is None
              else nvimgcodec_decoder(0, params.apply_exif, options))
    gpu = GpuPreprocessor(params, torch, torch.device("cuda", 0), decode, pool.map)
    datas = [list(photos.values())[i % len(photos)] for i in range(batch)]

    def one_batch() -> None:
        out = gpu.run([open_image(d, params) for d in datas], datas)
        gpu.to_host(out)

    one_batch()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        one_batch()
        done += batch
    rate = done / (time.perf_counter() - start)
    pool.shutdown()
    return {"batch": batch, "photos": len(photos), "items_per_s": round(rate, 1),
            "gpu_images": gpu.gpu_images, "cpu_images": gpu.cpu_images}


def corrupt_jpegs(photo: bytes) -> dict[str, bytes]:
    """Broken JPEGs: cut short, entropy data overwritten, and a header of 60k x 60k pixels."""
    middle = len(photo) // 2
    scrambled = photo[:middle] + bytes(range(256)) * 8 + photo[middle + 2048:]
    sof = photo.find(b"\xff\xc0")
    huge = bytearray(photo)
    if sof > 0:
        huge[sof + 5 : sof + 9] = (60000).to_bytes(2, "big") * 2
    return {"truncated": photo[:middle], "scrambled": scrambled, "huge_header": bytes(huge)}


def served_safety(grpc_url: str, model: str, good: list[bytes], bad: dict[str, bytes]) -> dict:
    """Bad JPEGs sent at the same time as good ones: what each request got back."""

    def send(data: bytes) -> str:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            out = embed_one(client, model, "IMAGE", data)
            return "ok" if np.isfinite(out).all() else "non-finite"
        except Exception as exc:  # noqa: BLE001 - the error is what is recorded
            return f"error: {exc}"[:300]

    jobs: list[tuple[str, bytes]] = [(f"good{i}", d) for i, d in enumerate(good * 4)]
    jobs += [(name, data) for name, data in bad.items()]
    with ThreadPoolExecutor(len(jobs)) as pool:
        outcomes = dict(zip([n for n, _ in jobs], pool.map(send, [d for _, d in jobs]),
                            strict=True))
    good_ok = sum(v == "ok" for k, v in outcomes.items() if k.startswith("good"))
    return {"good_ok": good_ok, "good_sent": len(good) * 4,
            "bad": {k: v for k, v in outcomes.items() if not k.startswith("good")},
            "server_still_ready": grpcclient.InferenceServerClient(grpc_url).is_server_ready()}


def _run_steps(steps: dict[str, Callable[[], object]]) -> dict:
    """Each step's result by key; a failing step records its traceback, the rest still run."""
    out: dict = {}
    for key, step in steps.items():
        try:
            out[key] = step()
        except Exception as exc:  # noqa: BLE001 - recorded; the next step still runs
            out[key] = {"error": traceback.format_exc()[-1500:]}
            print(f"[gpu_images] {key} failed: {exc}", flush=True)
    return out


def stubs_gpu_memory(nvidia_smi: Callable[..., list[list[str]]], models: list[str]) -> dict:
    """MiB of GPU memory held by each model's stub processes, and how many stubs hold some."""
    held: dict[str, dict[str, int]] = {}
    for pid, used in nvidia_smi("--query-compute-apps=pid,used_memory"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        for model in models:
            if f"/{model}/" in cmdline:
                entry = held.setdefault(model, {"mib": 0, "processes": 0})
                entry["mib"] += int(used)
                entry["processes"] += 1
    return held


def clip_gpu_decode(manifest) -> bool:
    """Whether the bench's CLIP model decodes its images on the GPU."""
    return any(e.name == CLIP_MODEL and e.image_decode == "gpu" for e in manifest.models)


def write_jpeg_only(perf_dir: Path, base_url: str) -> None:
    """``image_jpeg.json`` / ``image_url_jpeg.json``: the load's photos, JPEGs only."""
    names = sorted(p.name for p in (perf_dir / "images").glob("*.jpg"))
    datas = [(perf_dir / "images" / n).read_bytes() for n in names]
    for file, entries in (("image_jpeg.json", image_entries(datas)),
                          ("image_url_jpeg.json", url_entries([f"{base_url}/{n}" for n in names]))):
        (perf_dir / file).write_text(json.dumps({"data": entries}) + "\n")


def _clip_image(repo: Path):
    """(preprocess params, image tower ONNX path) of the served CLIP model."""
    params = config_parameters(repo / f"{CLIP_MODEL}_preprocess_image")
    return PreprocessParams.from_parameters(params), step_onnx(repo, f"{CLIP_MODEL}_encode_image")


def served_image_checks(url: str, repo: Path, photos: dict[str, bytes], nvidia_smi) -> dict:
    """Served GPU decode: parity with the exact path, bad JPEGs, stub GPU memory."""
    params, onnx = _clip_image(repo)
    model = f"{CLIP_MODEL}_image"
    jpegs = [d for n, d in photos.items() if n.endswith(".jpg")]
    models = sorted(p.name for p in repo.iterdir() if p.is_dir() and not p.name.startswith("."))
    return _run_steps({
        "stub_gpu_memory": lambda: stubs_gpu_memory(nvidia_smi, models),
        "served_parity": lambda: served_image_parity(url, model, parity_photos(), onnx, params),
        "safety": lambda: served_safety(url, model, jpegs[:4], corrupt_jpegs(jpegs[0])),
    })


def in_process_image_gpu(repo: Path, photos: dict[str, bytes]) -> dict:
    """Parity table and rate of the GPU image path in this process (server stopped)."""
    params, onnx = _clip_image(repo)
    jpegs = {n: d for n, d in photos.items() if n.endswith(".jpg")}
    return _run_steps({
        "image_gpu_parity": lambda: image_parity(onnx, params, parity_photos()),
        "image_preprocess_gpu": lambda: gpu_preprocess_rate(params, photos),
        "image_preprocess_gpu_jpeg": lambda: gpu_preprocess_rate(params, jpegs),
        "image_preprocess_gpu_jpeg_default_upsampling":
            lambda: gpu_preprocess_rate(params, jpegs, options=""),
    })


def probe() -> dict:
    """One photo through nvImageCodec and the GPU path, against Pillow (a smoke check)."""
    import torch

    data = parity_photos()["astronaut_q90.jpg"]
    decode = nvimgcodec_decoder(0, True)
    stream = int(torch.cuda.current_stream().cuda_stream)
    decoded = decode([data, data[:100] + b"\xff\xd9"], stream)
    pixels = torch.as_tensor(decoded[0], device="cuda").cpu().numpy().astype(int)
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    params = PreprocessParams(size=(224, 224), image_decode="gpu")
    gpu = GpuPreprocessor(params, torch, torch.device("cuda", 0), decode)
    out = gpu.run([open_image(data, params)], [data])[0].cpu().numpy()
    exact = preprocess_opened(open_image(data, params), params)
    levels = np.abs(pixels - reference)
    return {
        "decoded": [None if d is None else list(d.shape) for d in decoded],
        "decode_max_levels": int(levels.max()), "decode_mean_levels": float(levels.mean()),
        "pixel_values_max_abs": float(np.abs(out - exact).max()),
        "routed": [gpu.gpu_images, gpu.cpu_images],
    }
