#!/usr/bin/env bash
# System packages the tests need: Debian's chromium for the dashboard's headless-browser test.
# Installed only when missing, and only where we may (root with apt); otherwise say what to do.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian chromium (for the dashboard test)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "[setup] note: chromium is missing; install it (apt-get install chromium) for the dashboard test"
fi
