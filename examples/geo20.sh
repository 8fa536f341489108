#!/usr/bin/env bash
# The paper's setting: 20 peers round-robin over 12 GCP regions, 6 stages, 33% skip.
# Plans placement + paths, then simulates the iteration next to the full pipeline and random skip.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/geo20}
mkdir -p "$out"
.venv/bin/skippipe plan --profile geo-distributed --peers 20 --stages 6 --skip 0.33 -o "$out/schedule.json"
.venv/bin/skippipe simulate "$out/schedule.json" --gantt "$out/gantt.png"
# The reference instance itself (its measured link matrix and partition):
.venv/bin/skippipe plan --instance tests/assets/reference-geo20.json -o "$out/reference-schedule.json"
.venv/bin/skippipe simulate "$out/reference-schedule.json"
