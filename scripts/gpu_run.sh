#!/usr/bin/env bash
# Run the GPU check on an offline GPU node, from the checkout the bundle was built from:
#
#   scripts/gpu_run.sh OUTDIR [gpu_check.py flags...]
#   scripts/gpu_run.sh --python /opt/venv/bin/python3 OUTDIR --skip-compute
#   scripts/gpu_run.sh --dry-run OUTDIR              # print what it would install and run
#
# The bundle (.gpu/whl) comes from scripts/gpu_bundle.sh on a connected machine. Steps:
#   1. Install it beside the node's own packages, without an index or dependency resolution:
#        PY -m pip install --no-index --no-deps --no-compile --target SITE WHEELS
#      WHEELS: the project's five wheels, and each bundled dependency whose distribution PY
#      does not have already (the node's torch, jax, ... and their dependencies stay as they
#      are; --all-wheels installs every bundled wheel).
#   2. Run, with PYTHONPATH=SITE (plus PYTHONUNBUFFERED=1, XLA_PYTHON_CLIENT_PREALLOCATE=false):
#        PY scripts/gpu_check.py --backends equinox lightning keras-jax keras-torch \
#           --output OUTDIR/gpu-check.md --json OUTDIR/gpu-check.json [flags...]
#      its output also in OUTDIR/gpu-check.log (pip's in OUTDIR/pip.log).
# Exit status: gpu_check.py's (0 all checks pass, 1 a check failed, 2 no CUDA GPU); 2 for a
# missing bundle or bad arguments, 1 if the install fails.
#
# Options (before OUTDIR):
#   --python PY      the node's interpreter (default python3)
#   --pip "CMD"      the installer (default "PY -m pip"; e.g. "python3 -m pip" when PY is a
#                    virtual environment without pip)
#   --bundle DIR     the bundle (default .gpu)
#   --site DIR       where the wheels go (default /tmp/pipekit-gpu-site; emptied first when
#                    it is one this script made)
#   --all-wheels     install every bundled wheel, also those the node has
#   --dry-run        print the steps and commands; install and run nothing
#   -h, --help       this text
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

py="python3"
pip=""
bundle=".gpu"
site="/tmp/pipekit-gpu-site"
all=0
dry=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --python) py="$2"; shift 2 ;;
    --pip) pip="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    --site) site="$2"; shift 2 ;;
    --all-wheels) all=1; shift ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "gpu_run: unknown option: $1 (options come before OUTDIR; see --help)" >&2; exit 2 ;;
    *) break ;;
  esac
done
if [[ $# -lt 1 ]]; then
  echo "gpu_run: missing OUTDIR. Usage: scripts/gpu_run.sh [options] OUTDIR [gpu_check.py flags...]" >&2
  exit 2
fi
out="$1"; shift
check=("$py" scripts/gpu_check.py --backends equinox lightning keras-jax keras-torch
       --output "$out/gpu-check.md" --json "$out/gpu-check.json" "$@")

shopt -s nullglob
wheels=("$bundle"/whl/*.whl)
if [[ ${#wheels[@]} -eq 0 ]]; then
  if [[ $dry -eq 1 ]]; then
    echo "gpu_run: (no bundle at $bundle/whl yet: scripts/gpu_bundle.sh makes it)"
  else
    echo "gpu_run: no wheels in $bundle/whl. Build the bundle on a connected machine with" \
      "scripts/gpu_bundle.sh and copy $bundle/ here (or pass --bundle DIR)." >&2
    exit 2
  fi
fi

# step 1: which wheels to install (the node's python decides what it has)
install=()
if [[ ${#wheels[@]} -gt 0 ]]; then
  if [[ $all -eq 1 ]]; then
    install=("${wheels[@]}")
  else
    mapfile -t install < <(env -u PYTHONPATH "$py" - "${wheels[@]}" <<'PY'
import importlib.metadata as md
import os
import sys

for path in sys.argv[1:]:
    name = os.path.basename(path).split("-")[0]
    if name.startswith("pipekit_train"):
        print(path)  # the project's own: always
        continue
    try:
        have = md.version(name)
    except md.PackageNotFoundError:
        print(path)
        continue
    bundled = os.path.basename(path).split("-")[1]
    print(f"gpu_run: the node has {name} {have} (bundle: {bundled}): keeping the node's",
          file=sys.stderr)
PY
)
  fi
fi
read -r -a pip_cmd <<< "${pip:-$py -m pip}"
pip_cmd+=(install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site")
echo "gpu_run: step 1: ${pip_cmd[*]} <${#install[@]} of ${#wheels[@]} wheels>"
for w in "${install[@]}"; do echo "    $(basename "$w")"; done
echo "gpu_run: step 2: PYTHONPATH=$site ${check[*]}  (log: $out/gpu-check.log)"
if [[ $dry -eq 1 ]]; then
  echo "gpu_run: --dry-run: nothing installed or run"
  exit 0
fi

mkdir -p "$out"
t0=$SECONDS
if [[ -d "$site" && -n "$(ls -A "$site")" ]]; then
  if [[ -f "$site/.pipekit-gpu-site" ]]; then
    rm -rf "$site"
  else
    echo "gpu_run: $site holds files this script did not put there; pass another --site." >&2
    exit 2
  fi
fi
mkdir -p "$site"
touch "$site/.pipekit-gpu-site"
if ! "${pip_cmd[@]}" "${install[@]}" > "$out/pip.log" 2>&1; then
  tail -20 "$out/pip.log" >&2
  echo "gpu_run: the install failed (the whole log: $out/pip.log)" >&2
  exit 1
fi
echo "gpu_run: installed in $((SECONDS - t0)) s"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu-check.log"
fi
"${check[@]}" 2>&1 | tee -a "$out/gpu-check.log"
status=${PIPESTATUS[0]}
echo "gpu_run: gpu_check.py exit status $status after $((SECONDS - t0)) s; $out/gpu-check.md, .json, .log"
exit "$status"
