#!/usr/bin/env bash
# Bundle what an offline GPU node needs for the GPU check (scripts/gpu_check.py). Run it on a
# connected machine with uv, from anywhere in the checkout:
#
#   scripts/gpu_bundle.sh                          # -> .gpu/whl (git-ignored), for Python 3.12
#   scripts/gpu_bundle.sh --python-version 3.11 --platform manylinux_2_28_x86_64
#   scripts/gpu_bundle.sh --dry-run                # print the steps and the wheels; change nothing
#
# The node: Linux x86-64 without a package registry, whose python3 already holds torch, jax with
# its CUDA plugin, equinox, optax, orbax-checkpoint and lightning (and what they depend on).
# Then, on the node, from the same checkout: scripts/gpu_run.sh OUTDIR (see that script).
#
# Steps:
#   1. scripts/build_wheels.sh: the project's five wheels (pipekit-train-*), copied to OUT/whl.
#   2. From uv.lock, for the node's Python and platform: the dependencies of those five
#      (with pipekit-train-equinox's `mixed-precision` extra: jmp), less the frameworks the
#      node holds and everything they depend on (their closure in uv.lock), at the versions
#      uv.lock pins for that Python. A superset is harmless: scripts/gpu_run.sh installs only
#      the wheels whose distribution the node's python lacks.
#   3. pip download --no-deps --only-binary=:all: --python-version V --implementation cp
#      --platform P... of each into OUT/whl, and OUT/MANIFEST.txt saying what was bundled.
#
# Options:
#   --out DIR               the bundle's folder (default .gpu, at the checkout's root)
#   --python-version X.Y    the node's Python (default 3.12; X.Y.Z picks uv.lock's markers exactly)
#   --platform TAG          a wheel platform tag the node takes; repeat for several (default:
#                           manylinux_2_28 ... manylinux1, x86_64)
#   --node-has "NAMES"      the frameworks the node's python holds (default: torch jax jaxlib
#                           equinox optax orbax-checkpoint lightning numpy)
#   --extra NAME[==VER]     one more wheel to download (repeatable; also $EXTRA_WHEELS)
#   --dry-run               print the steps, the commands and the wheel list; build and
#                           download nothing (no network)
#   -h, --help              this text
# Environment: PYTHON (python3: reads uv.lock; needs 3.11+), PIP (python3 -m pip: downloads).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

out=".gpu"
pyver="3.12"
platforms=()
node_has="torch jax jaxlib equinox optax orbax-checkpoint lightning numpy"
extras=(${EXTRA_WHEELS:-})
dry=0
PYTHON="${PYTHON:-python3}"
PIP="${PIP:-python3 -m pip}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --python-version) pyver="$2"; shift 2 ;;
    --platform) platforms+=("$2"); shift 2 ;;
    --node-has) node_has="$2"; shift 2 ;;
    --extra) extras+=("$2"); shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_bundle: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ ! "$pyver" =~ ^3\.[0-9]+(\.[0-9]+)?$ ]]; then
  echo "gpu_bundle: --python-version must look like 3.12 or 3.12.3. Received: $pyver." >&2
  exit 2
fi
if [[ ${#platforms[@]} -eq 0 ]]; then
  platforms=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64
             manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)
fi
plat_args=()
for p in "${platforms[@]}"; do plat_args+=(--platform "$p"); done

# -- step 2: the dependencies the node lacks, from uv.lock -----------------------------------------
deps="$("$PYTHON" - "$root/uv.lock" "$pyver" "$node_has" <<'PY'
"""Print `name==version` for each dependency of the project's wheels the node lacks."""
import sys
import tomllib

try:
    from packaging.markers import Marker
except ImportError:  # a bare interpreter: pip's copy
    from pip._vendor.packaging.markers import Marker

lock, pyver, node_has = sys.argv[1], sys.argv[2], sys.argv[3].split()
full = pyver if pyver.count(".") == 2 else pyver + ".99"  # X.Y: the latest patch release
env = {
    "python_version": ".".join(full.split(".")[:2]), "python_full_version": full,
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
    "os_name": "posix", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "extra": "",
}


def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")


with open(lock, "rb") as fh:
    packages = tomllib.load(fh)["package"]
by_name = {}
for p in packages:
    by_name.setdefault(norm(p["name"]), []).append(p)


def holds(marker):
    return not marker or Marker(marker).evaluate(env)


def entry(name, version):
    found = by_name.get(norm(name), [])
    if version:
        found = [p for p in found if p["version"] == version]
    if len(found) > 1:  # uv.lock forks by Python version: the fork for this one
        fork = [p for p in found if any(holds(m) for m in p.get("resolution-markers", []))]
        found = fork or found
    if not found:
        sys.exit(f"gpu_bundle: {name} {version or ''} is not in uv.lock")
    return found[0]


def closure(roots, stop):
    seen, todo = {}, list(roots)
    while todo:
        name, version, extras = todo.pop()
        if norm(name) in stop or norm(name) in seen:
            continue
        p = seen[norm(name)] = entry(name, version)
        deps = list(p.get("dependencies", []))
        for extra in extras:
            deps += p.get("optional-dependencies", {}).get(extra, [])
        todo += [
            (d["name"], d.get("version"), d.get("extra", []))
            for d in deps
            if holds(d.get("marker"))
        ]
    return seen


ours = ["core", "equinox", "lightning", "keras", "sweep"]
roots = [(f"pipekit-train-{m}", None, ["mixed-precision"] if m == "equinox" else []) for m in ours]
have = closure([(n, None, []) for n in node_has if norm(n) in by_name], set())
need = closure(roots, set(have))
for name, p in sorted(need.items()):
    if "editable" not in p.get("source", {}):  # the project's own: step 1 builds them
        print(f"{p['name']}=={p['version']}")
PY
)"
read -r -a wanted <<< "$(echo $deps) ${extras[*]:-}"

echo "gpu_bundle: a bundle for Python $pyver on ${platforms[0]} (and ${#platforms[@]} platform tags) -> $out/whl"
echo "step 1: scripts/build_wheels.sh --out <tmp>; copy the five pipekit_train-*.whl to $out/whl"
echo "step 2: from uv.lock, the dependencies the node lacks (node has: $node_has):"
echo "        ${wanted[*]}"
echo "step 3: $PIP download --no-deps --only-binary=:all: --python-version $pyver --implementation cp ${plat_args[*]} -d $out/whl NAME==VERSION  (each of step 2)"
echo "then, on the node: scripts/gpu_run.sh OUTDIR  (installs $out/whl beside the node's packages, runs scripts/gpu_check.py)"
if [[ $dry -eq 1 ]]; then
  echo "gpu_bundle: --dry-run: nothing built or downloaded"
  exit 0
fi

t0=$SECONDS
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$out/whl"
mkdir -p "$out/whl"
echo "== step 1: building the project's wheels"
scripts/build_wheels.sh --out "$tmp/dist"
find "$tmp/dist" -name '*.whl' -exec cp {} "$out/whl/" \;
echo "== step 3: downloading ${#wanted[@]} wheels for Python $pyver"
for spec in "${wanted[@]}"; do
  if ! $PIP download -q --no-deps --only-binary=:all: --python-version "$pyver" \
      --implementation cp "${plat_args[@]}" -d "$out/whl" "$spec"; then
    echo "gpu_bundle: no wheel of $spec for Python $pyver on ${platforms[*]}; add --platform" \
      "manylinux_2_N_x86_64 for the node's glibc, or --extra another version" >&2
    exit 1
  fi
done
{
  echo "pipekit-train GPU bundle: Python $pyver, platforms ${platforms[*]}"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), built $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "node has: $node_has"
  (cd "$out/whl" && ls -1)
} > "$out/MANIFEST.txt"
echo "gpu_bundle: $out/whl: $(ls "$out/whl" | wc -l) wheels, $(du -sh "$out/whl" | cut -f1), $((SECONDS - t0)) s"
