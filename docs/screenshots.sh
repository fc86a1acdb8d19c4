#!/usr/bin/env bash
# Builds the docs strictly and photographs two rendered pages with headless
# Chromium (apt install chromium): docs/screenshots/{getting-started,benchmarks}.png.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m sphinx -W --keep-going -q -b html docs docs/_build/html
mkdir -p docs/screenshots
for page in getting-started benchmarks; do
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,2000 \
    --screenshot="docs/screenshots/$page.png" "file://$PWD/docs/_build/html/$page.html" \
    >/dev/null 2>&1
  echo "docs/screenshots/$page.png"
done
