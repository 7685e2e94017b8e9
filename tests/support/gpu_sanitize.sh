#!/usr/bin/env bash
# Runs every GPU example under NVIDIA's compute-sanitizer with its memcheck,
# racecheck and synccheck tools and prints a summary table. On a machine with
# an NVIDIA GPU and the CUDA toolkit (compute-sanitizer on PATH or under
# $CUDA_HOME/bin):
#
#     bash tests/support/gpu_sanitize.sh            # logs in ./sanitize-logs
#     SANITIZE_TOOLS=memcheck bash tests/support/gpu_sanitize.sh   # one tool
#
# Each example runs at a small size (the sanitizers slow kernels 10-100x).
# A run is clean when compute-sanitizer reports "ERROR SUMMARY: 0 errors" and
# the example itself exits 0. The exit status is the number of unclean runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export MLIRGPU_BACKEND=cuda
sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
if [ ! -x "$sanitizer" ]; then
  echo "compute-sanitizer not found (put the CUDA toolkit's bin on PATH or set CUDA_HOME)" >&2
  exit 127
fi
logs=${SANITIZE_LOGS:-sanitize-logs}
mkdir -p "$logs"

# example and its arguments (small problems)
examples=()
for kernel in examples/sgemm/k[0-9]*.py; do
  examples+=("$kernel 256 256 256 --repeat 1")
done
examples+=("examples/sgemm_naive.py 256 256 256" "examples/tiled_matmul.py 256 64 256"
           "examples/vectorize.py 65536" "examples/host_program.py")

unclean=0
printf '%-40s %-10s %-8s %s\n' example tool status errors
for entry in "${examples[@]}"; do
  read -r script args <<<"$entry"
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
    name=$(basename "$script" .py)-$tool
    # --target-processes all: the examples may start helper processes.
    "$sanitizer" --tool "$tool" --target-processes all --error-exitcode 99 \
      python3 "$script" $args >"$logs/$name.log" 2>&1
    status=$?
    # memcheck and synccheck end with "ERROR SUMMARY: N errors", racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
    errors=$(grep -Eo 'ERROR SUMMARY: [0-9]+|\([0-9]+ errors' "$logs/$name.log" | tail -1 | grep -Eo '[0-9]+')
    errors=${errors:-?}
    verdict=clean
    if [ "$status" != 0 ] || [ "$errors" != 0 ]; then
      verdict=UNCLEAN
      unclean=$((unclean + 1))
    fi
    printf '%-40s %-10s %-8s %s (exit %s)\n' "$(basename "$script") $args" "$tool" "$verdict" "$errors" "$status"
  done
done
echo "unclean runs: $unclean (logs in $logs/)"
exit "$unclean"
