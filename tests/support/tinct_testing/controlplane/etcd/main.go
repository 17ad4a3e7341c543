// etcd built from the published go.etcd.io/etcd/server/v3 module, for tinct's tests.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
