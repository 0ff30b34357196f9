#!/usr/bin/env bash
# Installs Debian's chromium and chromedriver when they are missing, for the /ui browser test
# (tests/ui/test_playground.py). Selenium drives them; nothing is downloaded at test time.
# Does nothing when both are present; says why and carries on (the test then skips) when they
# cannot be installed here (not root, or no apt-get).
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: chromium/chromedriver missing and cannot apt-get install here (need root and apt-get);" \
       "the browser test will be skipped" >&2
  exit 0
fi
echo "ensure-chromium: installing chromium and chromium-driver with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null \
  || { echo "ensure-chromium: apt-get install failed; the browser test will be skipped" >&2; exit 0; }
