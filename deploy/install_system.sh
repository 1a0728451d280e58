#!/usr/bin/env bash
# System packages the tests need: Debian's chromium for the dashboard's headless-browser test and,
# with chromium-driver (Selenium's WebDriver), the chat page's browser test (tests/test_chat_page.py);
# faketime (libfaketime) for the verifier clock-skew test (tests/test_faults_verifiers.py);
# nftables for the NAT routers of the WAN in a box (gt-devnet up --wan, tests/test_wan_*.py).
# Installed only when missing, and only where we may (root with apt); otherwise say what to do.
set -euo pipefail

missing=()
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    missing+=(chromium)
fi
if ! command -v chromedriver >/dev/null 2>&1; then
    missing+=(chromium-driver)
fi
if ! compgen -G "/usr/lib/*/faketime/libfaketime*.so.1" >/dev/null && \
   ! compgen -G "/usr/local/lib/faketime/libfaketime*.so.1" >/dev/null; then
    missing+=(faketime)
fi
if ! command -v nft >/dev/null 2>&1; then
    missing+=(nftables)
fi
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing Debian ${missing[*]} (dashboard and chat page tests, clock-skew test, WAN tests)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
    echo "[setup] note: ${missing[*]} missing; install (apt-get install ${missing[*]}) for the dashboard" \
         "clock-skew and WAN tests, which skip without them"
fi
