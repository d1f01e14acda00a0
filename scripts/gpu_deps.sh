#!/bin/sh
# gpu_deps.sh - the -dev packages' tree the device needs to build or run the full dsv4 (its image has CUDA but no
# Debian -dev libraries): `apt-get download` of cJSON, PCRE2 and libmicrohttpd (headers and libraries) and `dpkg -x`
# of each into DIR (default build-gfw-deps); libgnutls30 and its dependencies into DIR/gnutls, used only where the
# device has no libgnutls (scripts/gpu_test.sh). Carry DIR with the device tool's `carry`.
#   sh scripts/gpu_deps.sh [DIR]
set -eu
dir=${1:-build-gfw-deps}
pkgs="libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libmicrohttpd-dev libmicrohttpd12"
gnutls="libgnutls30 libidn2-0 libnettle8 libhogweed6 libp11-kit0 libtasn1-6 libunistring2 libgmp10 libffi8"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$dir/gnutls"
# shellcheck disable=SC2086
(cd "$tmp" && apt-get download $pkgs $gnutls >/dev/null) || {
    echo "gpu_deps: apt-get download failed (run 'apt-get update' first?)" >&2
    exit 1
}
for p in $pkgs; do dpkg -x "$tmp/${p}"_*.deb "$dir"; done
for p in $gnutls; do dpkg -x "$tmp/${p}"_*.deb "$dir/gnutls"; done
echo "gpu_deps: $dir ($(du -sh "$dir" | cut -f1))"
