#!/usr/bin/env bash
# Prepare this checkout to run: .venv/ with the project, Triton's server files, perf_analyzer,
# the Debian packages they need, and the default model files. Idempotent: a step whose stamp
# (under .venv/.hps-setup/) matches its inputs is skipped, so a re-run takes seconds.
#
#   bash scripts/setup.sh
#
# Environment:
#   PYTHON          interpreter that creates .venv (default: python3); Python >= 3.11
#   HPS_EXTRAS      extras of the project to install (default: test,bench; Docker: gpu)
#   TRITONSERVER    an existing Triton (NGC image): the nvidia-pytriton server files and the
#                   perf_analyzer that relies on their libraries are then not installed
# Works as root on a clean Debian 12 machine (installs what is missing with apt-get) and as
# a normal user where those packages are already there.
set -euo pipefail

PYTRITON_REQ="nvidia-pytriton==0.7.0"    # Triton 2.51 server files (no Python deps used)
PERF_ANALYZER_REQ="tritonclient==2.50.0" # its manylinux1 wheel carries the perf_analyzer binary

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$root/.venv
stamps=$venv/.hps-setup
python=${PYTHON:-python3}
extras=${HPS_EXTRAS:-test,bench}
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf 'setup: %s\n' "$*"; }

stamp_ok() { [ -f "$stamps/$1" ] && [ "$(cat "$stamps/$1")" = "$2" ]; }
stamp_set() { mkdir -p "$stamps" && printf '%s' "$2" > "$stamps/$1"; }

apt_updated=
apt_install() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages: $*; install them as root (apt-get install $*)" >&2
    exit 1
  fi
  if [ -z "$apt_updated" ]; then
    say "apt-get update"
    apt-get update -qq
    apt_updated=1
  fi
  say "apt-get install $*"
  # No service is started at install time: tests start the servers they need.
  local policy=/usr/sbin/policy-rc.d created=
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends "$@" \
    || { [ -n "$created" ] && rm -f "$policy"; exit 1; }
  if [ -n "$created" ]; then rm -f "$policy"; fi
}

missing_debs() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
      || printf '%s ' "$pkg"
  done
}

# --- 1. Python and Debian packages ------------------------------------------------------
if ! command -v "$python" >/dev/null 2>&1; then
  apt_install python3 python3-venv
fi
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "setup: $python is Python $pyver; this project needs Python >= 3.11 (NumPy 2.4, pyarrow 26)" >&2
  exit 1
fi
if ! "$python" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  apt_install python3-venv
fi
# redis-server: the Redis tier and its tests; openssl: the TLS tests' throwaway certificates.
debs="redis-server openssl"
# Triton's Python stub links libpython3.X.so; a Python built without it needs Debian's copy.
if ! "$python" - <<'PY'
import pathlib, sys, sysconfig
lib = pathlib.Path(sysconfig.get_config_var("LIBDIR") or "/") / (sysconfig.get_config_var("INSTSONAME") or "-")
sys.exit(0 if lib.exists() else 1)
PY
then
  debs="$debs libpython$pyver"
fi
# shellcheck disable=SC2086  # word splitting of the package list is intended
todo=$(missing_debs $debs)
if [ -n "$todo" ]; then
  # shellcheck disable=SC2086
  apt_install $todo
else
  say "Debian packages present ($debs)"
fi

# --- 2. virtual environment and the project ---------------------------------------------
venv_ver=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
if [ "$venv_ver" != "$pyver" ]; then
  # Missing, broken, or made by another Python (Triton's stub must match the venv's Python).
  say "creating $venv with $python (Python $pyver)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip)
project_key="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1) extras=$extras python=$pyver"
if stamp_ok project "$project_key"; then
  say "project already installed (pyproject.toml unchanged)"
else
  say "installing the project: pip install -e '.[$extras]'"
  "${pip[@]}" install -q -e "${root}[${extras}]"
  stamp_set project "$project_key"
fi
# TorchRec, the tests' reference for its drop-in tables, without its dependencies: its metadata
# asks for FBGEMM's CUDA wheel (gigabytes); the test extra holds the CPU build and the rest.
TORCHREC_REQ="torchrec==1.8.0"
if [[ ",$extras," == *",test,"* ]]; then
  if stamp_ok torchrec "$TORCHREC_REQ $project_key"; then
    say "TorchRec present ($TORCHREC_REQ)"
  else
    say "installing TorchRec: pip install --no-deps $TORCHREC_REQ"
    "${pip[@]}" install -q --no-deps "$TORCHREC_REQ"
    stamp_set torchrec "$TORCHREC_REQ $project_key"
  fi
fi

# --- 3. Triton server files --------------------------------------------------------------
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -n "${TRITONSERVER:-}" ]; then
  say "using Triton at TRITONSERVER=$TRITONSERVER; $PYTRITON_REQ not installed"
elif stamp_ok pytriton "$PYTRITON_REQ" && [ -x "$site/pytriton/tritonserver/bin/tritonserver" ]; then
  say "Triton server files present ($PYTRITON_REQ)"
else
  # --no-deps: its metadata pins numpy<2; only its server files are used, never its package.
  say "installing Triton server files: pip install --no-deps $PYTRITON_REQ"
  "${pip[@]}" install -q --no-deps "$PYTRITON_REQ"
  stamp_set pytriton "$PYTRITON_REQ"
fi

# --- 4. perf_analyzer ----------------------------------------------------------------------
pa_home=$venv/opt/perf_analyzer
pytriton_libs=$site/nvidia_pytriton.libs
if [ -n "${TRITONSERVER:-}" ]; then
  say "perf_analyzer skipped (its libraries come with $PYTRITON_REQ); use the Triton SDK image's"
elif stamp_ok perf_analyzer "$PERF_ANALYZER_REQ" && [ -x "$venv/bin/perf_analyzer" ]; then
  say "perf_analyzer present ($PERF_ANALYZER_REQ)"
else
  say "extracting perf_analyzer from the $PERF_ANALYZER_REQ manylinux1 wheel"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "${pip[@]}" download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
    -d "$tmp" "$PERF_ANALYZER_REQ"
  rm -rf "$pa_home"
  mkdir -p "$pa_home/bin" "$pa_home/lib"
  "$venv/bin/python" - "$tmp" "$pa_home/bin/perf_analyzer" <<'PY'
import pathlib, shutil, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("tritonclient-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    member = next(n for n in zf.namelist() if n.endswith(".data/data/bin/perf_analyzer"))
    with zf.open(member) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  chmod +x "$pa_home/bin/perf_analyzer"
  # It needs libb64.so.0d and libcudart.so.12 even without a GPU: link the wheel's copies.
  for pair in "libb64.so.0d:libb64-*.so.0d" "libcudart.so.12:libcudart-*.so.12*"; do
    name=${pair%%:*}
    # shellcheck disable=SC2206  # the pattern is meant to glob
    matches=("$pytriton_libs"/${pair#*:})
    if [ ! -e "${matches[0]}" ]; then
      echo "setup: $pytriton_libs has no ${pair#*:} (needed by perf_analyzer)" >&2
      exit 1
    fi
    ln -sfn "${matches[0]}" "$pa_home/lib/$name"
  done
  cat > "$venv/bin/perf_analyzer" <<'SH'
#!/bin/sh
# perf_analyzer from the tritonclient 2.50.0 wheel; its libraries are set for it alone.
home=$(cd "$(dirname "$(readlink -f "$0")")/../opt/perf_analyzer" && pwd)
LD_LIBRARY_PATH="$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$home/bin/perf_analyzer" "$@"
SH
  chmod +x "$venv/bin/perf_analyzer"
  "$venv/bin/perf_analyzer" --version >/dev/null 2>&1 || {
    echo "setup: $venv/bin/perf_analyzer does not start:" >&2
    "$venv/bin/perf_analyzer" --version >&2 || true
    exit 1
  }
  stamp_set perf_analyzer "$PERF_ANALYZER_REQ"
fi

# --- 5. default model files ----------------------------------------------------------------
if "$venv/bin/hps" prepare --help >/dev/null 2>&1; then
  say "preparing model files: hps prepare model_repository"
  (cd "$root" && "$venv/bin/hps" prepare model_repository)
else
  say "hps prepare not available yet; model files not prepared"
fi
say "done"
