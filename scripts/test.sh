#!/usr/bin/env bash
# Set up (if needed), lint, and run the test suite; extra arguments go to pytest.
#   bash scripts/test.sh                      # everything
#   bash scripts/test.sh tests/unit -k ports  # a subset
# Exit code: pytest's (or ruff's when only lint failed); "no tests ran" counts as a failure.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root" || exit 1
bash scripts/setup.sh || exit $?

echo "test: ruff check ."
.venv/bin/ruff check .
lint=$?

# setup.sh installed Triton: a missing server must fail the integration tests, not skip them.
export HPS_REQUIRE_TRITON=1
# One worker per core, each taking whole test files (module-scoped servers stay per file):
# the integration tests mostly wait on servers, so two workers halve the wall time on 2 cores.
args=(-q --durations=15 -n auto --dist loadfile)
if .venv/bin/python -c 'import pytest_timeout' 2>/dev/null; then
  args+=(--timeout=900)  # a hung server or client must not eat the whole CI budget
fi
echo "test: pytest ${args[*]} $*"
.venv/bin/pytest "${args[@]}" "$@"
status=$?
if [ "$status" -eq 5 ]; then
  echo "test: pytest collected no tests; treating that as a failure" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  exit "$status"
fi
exit "$lint"
