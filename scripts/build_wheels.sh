#!/usr/bin/env bash
# Build the wheel and sdist of each pipekit-train distribution, one folder per distribution:
#
#   scripts/build_wheels.sh                          # all five -> dist/<dist>/
#   scripts/build_wheels.sh pipekit-train-equinox    # just one
#   scripts/build_wheels.sh --out /tmp/dist          # another output root
#
# `--no-sources`: build with the published metadata (the workspace's [tool.uv.sources] are
# development-only), exactly what a release publishes. `--out-dir dist/<dist>`: every
# `uv build` in a workspace otherwise writes into the shared root dist/, and `uv publish`
# would then upload every package built so far (STYLE.md 2.8, pitfall 4). uv builds the
# sdist first and the wheel from that sdist, so a broken sdist fails here.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_BIN="${UV:-uv}"
if ! command -v "$UV_BIN" >/dev/null 2>&1; then UV_BIN="python3 -m uv"; fi

ALL=(pipekit-train-core pipekit-train-equinox pipekit-train-lightning pipekit-train-keras pipekit-train-sweep)
out="dist"
dists=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --out=*) out="${1#--out=}"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    pipekit-train-*) dists+=("$1"); shift ;;
    *) echo "unknown argument: $1 (expected --out DIR or a distribution name: ${ALL[*]})" >&2; exit 2 ;;
  esac
done
[[ ${#dists[@]} -eq 0 ]] && dists=("${ALL[@]}")

for dist in "${dists[@]}"; do
  member="packages/${dist#pipekit-train-}"
  if [[ ! -f "$member/pyproject.toml" ]]; then
    echo "no workspace member for $dist (expected $member/pyproject.toml)" >&2
    exit 2
  fi
  rm -rf "${out:?}/$dist"
  $UV_BIN build --quiet --package "$dist" --no-sources --out-dir "$out/$dist"
  echo "built $(cd "$out/$dist" && ls | tr '\n' ' ')"
done
