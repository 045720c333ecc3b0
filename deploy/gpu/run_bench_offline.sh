#!/usr/bin/env bash
# The GPU benchmark on a CUDA host that has Python 3.12 with torch, sentence-transformers
# and onnx but no network: the serve-time wheels travel as one payload (made here by
# deploy/gpu/make_payload.sh: onnxruntime-gpu, nvidia-pytriton, open_clip_torch, the
# tritonclient client and perf_analyzer 2.51 with its libraries, numpy<2 for the stubs,
# a BERT tokenizer), split into parts that are concatenated in $GPU_PARTS.
#
#   GPU_PARTS=/tmp/gpu-parts deploy/gpu/run_bench_offline.sh --out /tmp/gpu-results
#
# Arguments go to `python -m bench.gpu` (BENCH_MODULE=bench.gpu.fusion: the in-process
# fusion study, which takes --tokenizer and its own options). The CUDA 13 libraries onnxruntime-gpu needs
# (cuBLAS, cuDNN 9, cuFFT, cuRAND, NVRTC) are taken from the host's CUDA install and the
# nvidia-* wheels next to its torch.
set -euo pipefail
parts=${GPU_PARTS:-/tmp/gpu-parts}
stage=${GPU_STAGE:-/tmp/gpu-stage}
python=${PYTHON:-python3}

if [[ ! -f $stage/.unpacked ]]; then
    mkdir -p "$stage"
    cat "$parts"/part-* | xz -d | tar -x -C "$stage"
    # numpy<2 only for the Python-backend stubs (built against numpy 1.x); the generator
    # and the load side keep the host's numpy.
    mkdir -p "$stage/stub-numpy"
    mv "$stage"/site/numpy "$stage"/site/numpy.libs "$stage"/site/numpy-*.dist-info \
        "$stage/stub-numpy/"
    touch "$stage/.unpacked"
fi

site_packages=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# nvImageCodec's wheel makes `nvidia` a regular package; where the host's nvidia-* wheels
# share it as a namespace package, drop that __init__.py so both halves stay importable.
if [[ -d $site_packages/nvidia && ! -f $site_packages/nvidia/__init__.py ]]; then
    rm -f "$stage/site/nvidia/__init__.py"
fi
cuda_libs=()
for dir in /usr/local/cuda/lib64 "$site_packages"/nvidia/cu13/lib "$site_packages"/nvidia/cudnn/lib; do
    [[ -d $dir ]] && cuda_libs+=("$dir")
done
# The Python-backend stubs start their interpreter isolated: PYTHONPATH does not reach
# them, the site-packages .pth files do. This one adds $EMBED_STUB_SYSPATH (set by
# bench.gpu for the server only) to the front of sys.path.
cat >"$site_packages/zz_embed_stub_syspath.pth" <<'PTH'
import os, sys; sys.path[0:0] = [p for p in os.environ.get("EMBED_STUB_SYSPATH", "").split(":") if p]
PTH
LD_LIBRARY_PATH=$(IFS=:; echo "${cuda_libs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
export PYTHONPATH=$stage/site${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

cat >"$stage/perf_analyzer" <<WRAP
#!/usr/bin/env bash
LD_LIBRARY_PATH=$stage/pa/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH} exec $stage/pa/bin/perf_analyzer "\$@"
WRAP
chmod +x "$stage/perf_analyzer"

if [[ ${BENCH_MODULE:-bench.gpu} == bench.gpu.fusion ]]; then
    exec "$python" -m bench.gpu.fusion --tokenizer "$stage/tok" "$@"
fi
exec "$python" -m bench.gpu --tokenizer "$stage/tok" --perf-analyzer "$stage/perf_analyzer" \
    --stub-pythonpath "$stage/stub-numpy:$stage/site" "$@"
