#!/usr/bin/env bash
# Open MPI for a machine that has none, or another version (docs/parallel.md, "On a machine
# without Open MPI"; the lent GPU machines' Ubuntu 24.04 turned out to have Open MPI 4.1 of its own).
# nopad's tensor parallelism on CUDA starts its workers through Open MPI (MPI_Comm_spawn, or a
# command under mpirun) and sends NCCL's unique id over it, and libnopad.so links this machine's
# Open MPI (Debian's 4.1). This packs that Open MPI's runtime (mpirun, orted, the libraries, the
# MCA components, PMIx, the help texts and what they link) into one archive with the paths under
# /usr kept, to unpack anywhere: Open MPI finds its files through OPAL_PREFIX, PMIx its components
# through PMIX_MCA_mca_base_component_path.
#
#   here:   scripts/openmpi_carry.sh --stage            (.gpu_carry/ompi/openmpi.tar.xz, ~5 MB)
#   there:  source scripts/openmpi_carry.sh --use        (unpacks to /tmp/nopad_ompi, sets PATH,
#                                                         LD_LIBRARY_PATH, OPAL_PREFIX, ...)
#           carry [".gpu_carry/ompi"] with the call.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CARRY="$ROOT/.gpu_carry/ompi"
ARCH=x86_64-linux-gnu

if [ "${1:-}" = "--stage" ]; then
    set -euo pipefail
    command -v orterun >/dev/null || { echo "no Open MPI here: scripts/install_deps.sh" >&2; exit 1; }
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    list="$stage/files"
    # the packages' own files (binaries, libraries, components, help texts, the PMIx tree)
    for pkg in openmpi-bin libopenmpi3 openmpi-common libpmix2; do
        dpkg -L "$pkg" | while read -r f; do [ -f "$f" ] && echo "$f"; done
    done | grep -v -E '^/usr/share/(doc|man|lintian)/' > "$list"
    # what they link, but the C library's own (the GPU machine has those)
    grep -E '\.so(\.[0-9]+)*$|/bin/' "$list" | while read -r f; do ldd "$f" 2>/dev/null || true; done |
        awk '/=> \//{print $3}' | sort -u |
        grep -v -E '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' |
        while read -r lib; do echo "$lib"; readlink -f "$lib"; done >> "$list"
    mkdir -p "$stage/root"
    sort -u "$list" | tar cf - -T - 2>/dev/null | tar xf - -C "$stage/root"
    # mpirun is a link to orterun in /etc/alternatives: a plain link in the tree instead
    ln -sf orterun "$stage/root/usr/bin/mpirun"
    mkdir -p "$CARRY"
    (cd "$stage/root" && tar cf - usr | xz -9 -T1 > "$CARRY/openmpi.tar.xz")
    ls -la "$CARRY"
    exit 0
fi

if [ "${1:-}" = "--use" ]; then
    # sourced: unpack once, then the environment that makes the copy the one found
    ompi=/tmp/nopad_ompi
    if [ ! -x "$ompi/usr/bin/orted" ]; then
        [ -f "$CARRY/openmpi.tar.xz" ] || { echo "openmpi_carry.sh: no $CARRY/openmpi.tar.xz (--stage it here, carry it)" >&2; return 1; }
        mkdir -p "$ompi" && tar xJf "$CARRY/openmpi.tar.xz" -C "$ompi"
    fi
    export OPAL_PREFIX=$ompi/usr
    export PMIX_MCA_mca_base_component_path=$ompi/usr/lib/$ARCH/pmix2/lib/pmix
    export PATH=$ompi/usr/bin:$PATH
    export LD_LIBRARY_PATH=$ompi/usr/lib/$ARCH/openmpi/lib:$ompi/usr/lib/$ARCH/pmix2/lib:$ompi/usr/lib/$ARCH:$ompi/usr/lib/libpsm1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    # components whose network libraries the machine lacks (InfiniBand, OFI) stay quiet
    export OMPI_MCA_mca_base_component_show_load_errors=0
    # root in the container; one machine
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export NOPAD_MPIRUN=$ompi/usr/bin/mpirun
    return 0 2>/dev/null || exit 0
fi

echo "usage: scripts/openmpi_carry.sh --stage | source scripts/openmpi_carry.sh --use" >&2
exit 2
