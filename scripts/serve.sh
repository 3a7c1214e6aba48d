#!/usr/bin/env bash
# Set up (if needed) and serve the model repository with Triton in the foreground.
#   bash scripts/serve.sh [hps serve options] [-- tritonserver options]
# Ctrl+C stops the server and its model processes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
exec "$root/.venv/bin/hps" serve "$@"
