#!/usr/bin/env bash
# An arm64 Debian (bookworm) folder with Python 3.11, numpy and the Python headers, for building
# and testing the engine for aarch64 under qemu-aarch64 on an x86-64 machine (test_variant.sh
# aarch64). Packages come from Debian's archive through debootstrap's first stage, unpacked
# without their scripts; the folder is cached and its path printed.
set -euo pipefail
cache=${SELECTINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/selectinfer}
sysroot=$cache/arm64-sysroot-bookworm
packages=python3,python3-numpy,libpython3.11-dev
if [ ! -f "$sysroot/.selectinfer-complete" ]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
  rm -rf "$sysroot.tmp"
  mkdir -p "$cache"
  debootstrap --arch=arm64 --foreign --variant=minbase --include=$packages bookworm "$sysroot.tmp" \
      http://deb.debian.org/debian >&2
  # the first stage unpacks only the essential packages; the rest, without maintainer scripts
  for deb in "$sysroot.tmp"/var/cache/apt/archives/*.deb; do dpkg -x "$deb" "$sysroot.tmp"; done
  rm -f "$sysroot.tmp"/var/cache/apt/archives/*.deb
  # what update-alternatives would have linked
  lib=$sysroot.tmp/usr/lib/aarch64-linux-gnu
  ln -sf blas/libblas.so.3 "$lib/libblas.so.3"
  ln -sf lapack/liblapack.so.3 "$lib/liblapack.so.3"
  touch "$sysroot.tmp/.selectinfer-complete"
  rm -rf "$sysroot"
  mv "$sysroot.tmp" "$sysroot"
fi
echo "$sysroot"
