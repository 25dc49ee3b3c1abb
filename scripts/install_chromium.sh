#!/usr/bin/env bash
# Debian's Chromium for the browser test of the report page (tests/test_report_browser.py).
# Never fails the command it is part of: without Chromium that test is skipped and says why.
set -u
if command -v chromium >/dev/null 2>&1 || [ -n "${MASKFUZZ_CHROMIUM:-}" ]; then
    exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium >/dev/null 2>&1 \
        || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }
fi
if command -v chromium >/dev/null 2>&1; then
    echo "install_chromium: $(chromium --version 2>/dev/null)"
else
    echo "install_chromium: no Chromium (not root, no apt-get, or no package): the report page's browser test will be skipped" >&2
fi
exit 0
