// etcd as its server module builds it (go.etcd.io/etcd/server/v3/main.go), at the version
// Kubernetes' own go.mod names.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
