#!/usr/bin/env bash
# Install Debian's Chromium and its chromedriver: the UI tests drive Prefect's UI headless with Selenium.
# Idempotent: a no-op when both are installed. Installing needs root (apt-get).
set -euo pipefail
# shellcheck source=../apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/../apt.sh"
apt_install "browser/install.sh" chromium chromium-driver
