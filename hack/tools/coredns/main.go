// Command coredns is CoreDNS with only the plugins the local cluster of
// test/cluster uses (bind, kubernetes, cache, errors, log, health, ready, loadbalance):
// the stock build links every cloud provider's SDK and takes far longer to
// build. The Directives order of CoreDNS itself still applies.
package main

import (
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
