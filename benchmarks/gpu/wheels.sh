#!/usr/bin/env bash
# The wheels a GPU host needs (../shared/device/wheels.sh) and those loom needs beyond its
# list: llguidance (structured output), what fastapi 0.165 imports (opentelemetry-api,
# annotated-doc) and what openai 3.x imports beyond the host's httpx (httpx2, httpcore2,
# truststore). Without them `import loom` or `loom serve` fails on the host at once (run_zb,
# run_zzu and session 20's first two calls), or tests/entrypoints does (run_zzz80).
# compressed-tensors (and its loguru) write the quantized test checkpoints (fp8, int4).
set -euo pipefail
dest=${1:-.whl}
"$(dirname "$0")/../../../shared/device/wheels.sh" "$dest"
python3 -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$dest" llguidance opentelemetry-api annotated-doc httpx2 httpcore2 truststore \
  compressed-tensors==0.20.1 loguru
du -sh "$dest"
