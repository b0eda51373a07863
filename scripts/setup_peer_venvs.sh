#!/usr/bin/env bash
# Create the peer venvs that `rlf-bench env --compare` drives as subprocesses:
#   .venv-peers/gem        gem-llm==0.1.0 with its MCP extra (fastmcp client)
#   .venv-peers/verifiers  verifiers==0.4.0 (pins mcp==2.0.0, so it cannot share our environment)
# Each venv is independent: if one install fails, the script says why and goes on with the next,
# and `--compare` prints that peer's row as "not installed".
#
# Usage: bash scripts/setup_peer_venvs.sh [--force]      (PYTHON=python3.11 to pick the interpreter)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENVS="${RLF_PEER_VENVS:-$ROOT/.venv-peers}"  # rlf-bench reads $RLF_PEER_VENVS too, else ./.venv-peers
PYTHON="${PYTHON:-python}"
FORCE="${1:-}"
mkdir -p "$VENVS"

# peer name -> pip requirements (the peer pinned exactly; the rest is what its driver imports)
declare -A REQUIREMENTS=(
  [gem]="gem-llm[mcp]==0.1.0"
  [verifiers]="verifiers==0.4.0"
)
# a peer driver must import these for the venv to count as ready
declare -A PROBES=(
  [gem]="import gem, fastmcp; from gem.tools.mcp_tool import MCPTool; from gem.vector.async_vector_env import AsyncVectorEnv"
  [verifiers]="import mcp, verifiers.v1; from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE"
)

status=0
for peer in gem verifiers; do
  venv="$VENVS/$peer"
  log="$VENVS/$peer.install.log"
  if [[ "$FORCE" == "--force" ]]; then rm -rf "$venv"; fi
  if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "${PROBES[$peer]}" >/dev/null 2>&1; then
    echo "[$peer] ready: $venv"
    continue
  fi
  echo "[$peer] creating $venv (log: $log)"
  if ! "$PYTHON" -m venv "$venv" >"$log" 2>&1; then
    echo "[$peer] FAILED: could not create the venv (see $log)"; status=1; continue
  fi
  "$venv/bin/python" -m pip install -q --upgrade pip >>"$log" 2>&1
  # shellcheck disable=SC2086
  if ! "$venv/bin/python" -m pip install ${REQUIREMENTS[$peer]} >>"$log" 2>&1; then
    echo "[$peer] FAILED: pip install ${REQUIREMENTS[$peer]} did not succeed; last lines of $log:"
    tail -n 5 "$log" | sed 's/^/    /'
    status=1; continue
  fi
  if ! probe_error="$("$venv/bin/python" -c "${PROBES[$peer]}" 2>&1)"; then
    echo "[$peer] FAILED: installed but the driver's imports fail:"
    echo "$probe_error" | tail -n 3 | sed 's/^/    /'
    status=1; continue
  fi
  echo "[$peer] ready: $venv ($("$venv/bin/python" -m pip show "${REQUIREMENTS[$peer]%%[=\[]*}" 2>/dev/null | grep ^Version))"
done
exit $status
