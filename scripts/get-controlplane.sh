#!/usr/bin/env bash
# The real Kubernetes control plane of the tests, built from Go modules through the Go module
# proxy (nothing else is downloaded): kube-apiserver, kube-controller-manager, kube-scheduler
# and etcd from tests/k8s/controlplane (Kubernetes 1.34.2, etcd 3.6.4, the versions that
# release's go.mod names), and kwok's controller (sigs.k8s.io/kwok), which makes pods on fake
# nodes Running and Ready. Binaries go to .tools/k8s/<key>/bin, where <key> is a digest of
# the inputs; the Go module and build caches (~/go/pkg/mod, ~/.cache/go-build) make a rebuild
# after a change fast.
set -euo pipefail
cd "$(dirname "$0")/.."
KWOK_VERSION=v0.8.0
if ! command -v go >/dev/null 2>&1; then
    echo "get-controlplane: go not found; install Go (apt-get install -y golang) for the control-plane tests" >&2
    exit 1
fi
key=$( (cat "$0" tests/k8s/controlplane/go.mod tests/k8s/controlplane/go.sum tests/k8s/controlplane/cmd/*/main.go;
        echo "$KWOK_VERSION"; go version) | sha256sum | cut -c1-16)
dest=".tools/k8s/$key"
if [ ! -f "$dest/.complete" ]; then
    started=$(date +%s)
    echo "get-controlplane: building kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok"
    mkdir -p "$dest/bin"
    # The version stamps Kubernetes' own build sets (hack/lib/version.sh): the API server
    # reports v1.34.2, which helm checks against a chart's kubeVersion.
    release=$(sed -n 's/^\tk8s.io\/kubernetes v\(.*\)$/\1/p' tests/k8s/controlplane/go.mod)
    stamp=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        stamp="$stamp -X $pkg.gitVersion=v$release -X $pkg.gitMajor=${release%%.*}"
        minor=${release#*.}
        stamp="$stamp -X $pkg.gitMinor=${minor%%.*} -X $pkg.gitTreeState=clean"
    done
    (cd tests/k8s/controlplane && go build -trimpath -ldflags="-s -w $stamp" -o "../../../$dest/bin/" ./cmd/...)
    # kwok, with one line of its pod controller changed: it deletes a pod by name alone, so a
    # deletion still queued for a pod that is gone deleted the pod the StatefulSet controller
    # had recreated under the same name (a loaded CI machine saw a broker replaced twice). The
    # kubelet it plays deletes with the pod's UID as a precondition, "to prevent deleting a
    # newly created pod with the same name and namespace" (pkg/kubelet/status/status_manager.go);
    # so does this build. (go build -overlay may not replace files of the module cache: the
    # module is copied.)
    kwok_dir=$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
    kwok_src=$(mktemp -d)
    trap 'rm -rf "$kwok_src"' EXIT  # also when the check or the build below fails
    cp -r "$kwok_dir/." "$kwok_src" && chmod -R u+w "$kwok_src"
    controller="$kwok_src/pkg/kwok/controllers/pod_controller.go"
    sed -i 's/Delete(ctx, pod.Name, deleteOpt)/Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: deleteOpt.GracePeriodSeconds, Preconditions: metav1.NewUIDPreconditions(string(pod.UID))})/' "$controller"
    grep -q 'Preconditions: metav1.NewUIDPreconditions(string(pod.UID))' "$controller" || {
        echo "get-controlplane: kwok $KWOK_VERSION's pod deletion is not the line this script changes" >&2
        exit 1
    }
    out="$PWD/$dest/bin/kwok"
    (cd "$kwok_src" && GOFLAGS=-trimpath go build -ldflags="-s -w" -o "$out" ./cmd/kwok)
    # kwok's controller loads no stages by itself (kwokctl passes them): its own "fast"
    # node and pod stages, from the same module.
    stages="$kwok_dir/kustomize/stage"
    for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml \
             pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        cat "$stages/$f"
        echo "---"
    done > "$dest/kwok-stages.yaml"
    touch "$dest/.complete"
    echo "get-controlplane: built in $(( $(date +%s) - started )) s"
fi
ln -sfn "$key" .tools/k8s/current
find .tools/k8s -mindepth 1 -maxdepth 1 -type d ! -name "$key" -exec rm -rf {} +  # earlier builds
