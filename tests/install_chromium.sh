#!/usr/bin/env bash
# `make test` needs a browser: the inbox's browser tests (tests/integration/test_inbox_browser.py)
# drive headless Chromium through chromedriver with selenium. Debian's packages, installed if
# missing; no browser is downloaded from anywhere else.
set -euo pipefail
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "make test: installing Chromium and chromedriver (Debian's packages)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver \
    || { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium chromium-driver; }
fi
