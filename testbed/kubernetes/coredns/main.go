// The test cluster's DNS (tests/cluster/up.py): CoreDNS with the plugins the harness's
// Corefile uses (bind, errors, ready, kubernetes, cache) and no other, so that building it
// compiles and downloads what runs, not every cloud provider's SDK.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
