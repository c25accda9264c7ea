#!/usr/bin/env bash
# The tests' S3-compatible object store (tests/object_store.py), built from Go modules through
# the Go module proxy (nothing else is downloaded): tests/objectstore's s3server, gofakes3 on a
# directory. The binary goes to .tools/objectstore/<key>/bin, where <key> is a digest of the
# inputs, so a changed server or Go is rebuilt and an unchanged one returns at once; the Go
# module and build caches (~/go/pkg/mod, ~/.cache/go-build) make a rebuild after a change fast.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v go >/dev/null 2>&1; then
    echo "get-objectstore: go not found; install Go (apt-get install -y golang) for the object-store tests" >&2
    exit 1
fi
key=$( (cat "$0" tests/objectstore/go.mod tests/objectstore/go.sum tests/objectstore/cmd/*/main.go;
        go version) | sha256sum | cut -c1-16)
dest=".tools/objectstore/$key"
if [ ! -f "$dest/.complete" ]; then
    started=$(date +%s)
    echo "get-objectstore: building s3server (gofakes3)"
    mkdir -p "$dest/bin"
    (cd tests/objectstore && go build -trimpath -ldflags="-s -w" -o "../../$dest/bin/" ./cmd/...)
    touch "$dest/.complete"  # last: a build cut short is not taken for a finished one
    echo "get-objectstore: built in $(( $(date +%s) - started )) s"
fi
ln -sfn "$key" .tools/objectstore/current
find .tools/objectstore -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +  # earlier builds
