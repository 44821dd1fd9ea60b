#!/bin/bash
# study_archive.sh STUDY_DIR ARCHIVE.tar.gz: a study's small files, enough to report on it and to resume it on a
# fresh machine (`quality-real` untars it into an empty study folder; tests/study/test_study.py resumes from one):
# the study's CSVs, JSONs, README and logs, and each point's CSVs and JSONs (done.json with the fingerprints of its
# CSVs among them). No caches (teacher checkpoints, top-k stores: a fresh machine builds its own), no notebooks and
# no figures (committed archives stay small; `workbench study --name S --report-only` on the unpacked folder draws
# the figures again). A point CSV over 2 MB is left out, and that point is run again.
set -euo pipefail
study=$1 archive=$(realpath -m "$2")
cd "$study"
{ ls -- *.csv *.json *.md *.log 2>/dev/null || true
  find . -mindepth 2 -maxdepth 2 -not -path './cache/*' \( -name '*.csv' -o -name '*.json' \) -size -2000k; } \
  | tar -czf "$archive" -T -
