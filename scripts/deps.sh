#!/bin/sh
# Installs the Debian packages dsv4 builds against when a header is missing (as root), or prints
# the exact command to run.
missing=""
check() { [ -e "$1" ] || missing="$missing $2"; }
check /usr/include/cjson/cJSON.h libcjson-dev
check /usr/include/pcre2.h libpcre2-dev
check /usr/include/microhttpd.h libmicrohttpd-dev
check /usr/include/criterion/criterion.h libcriterion-dev
command -v pkg-config >/dev/null 2>&1 || missing="$missing pkg-config"
command -v curl >/dev/null 2>&1 || missing="$missing curl"          # server tests
command -v python3 >/dev/null 2>&1 || missing="$missing python3 python3-pip"
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "deps: installing$missing" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >&2 || {
        echo "deps: apt-get install failed" >&2; exit 1; }
else
    echo "deps: missing packages; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
