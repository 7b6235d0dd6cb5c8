#!/bin/bash
# Run a command as an AVX2-only CPU would run it, on a CPU with AVX-512: the figures of a machine one does not have.
#
#   analysis/emulate_avx2.sh .venv/bin/otm demo
#   OTM_CACHE=/tmp/avx2-cache analysis/emulate_avx2.sh .venv/bin/otm bench-decode --threads 1 ...
#
# What it limits, in a private mount namespace (root, or unprivileged user namespaces):
# - /proc/cpuinfo without the avx512*, amx*, avx_vnni* flags (otm's dtype choice, machine line and cache keys);
# - torch's kernels and inductor's generated code: ATEN_CPU_CAPABILITY=avx2;
# - oneDNN: ONEDNN_MAX_CPU_ISA=AVX2; MKL: MKL_ENABLE_INSTRUCTIONS=AVX2;
# - OTM_EMULATED names the emulation in every machine line (and so in every cache key).
# What it cannot change: memory bandwidth, caches and clock, and AVX2 code runs on the wider core's units (Zen 4
# executes AVX2 at about its AVX-512 rate); a real AVX2 machine can be slower (docs/decode.md, "An AVX2 machine").
set -euo pipefail
if [ $# -eq 0 ]; then
    echo "emulate_avx2.sh: give the command to run, e.g. analysis/emulate_avx2.sh .venv/bin/otm demo" >&2
    exit 2
fi
fake=$(mktemp /tmp/otm-avx2-cpuinfo.XXXXXX)
trap 'rm -f "$fake"' EXIT
sed -E 's/ (avx512[a-z0-9_]*|amx[a-z0-9_]*|avx_vnni[a-z0-9_]*)//g' /proc/cpuinfo > "$fake"
if [ "$(id -u)" = 0 ]; then ns=(unshare -m); else ns=(unshare -r -m); fi
if ! "${ns[@]}" true 2>/dev/null; then
    echo "emulate_avx2.sh: cannot make a private mount namespace here (${ns[*]} failed): run it as root or where user namespaces are allowed" >&2
    exit 2
fi
export ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export OTM_EMULATED="AVX2 only (analysis/emulate_avx2.sh on a CPU with AVX-512)"
"${ns[@]}" bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$fake" "$@"
