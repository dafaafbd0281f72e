package testpod

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/sockscale/sockscale/internal/testutil/cgroup2"
	"github.com/sockscale/sockscale/internal/testutil/namedns"
	"github.com/sockscale/sockscale/internal/testutil/testenv"
)

func TestMain(m *testing.M) {
	Main() // returns unless this process is a test pod's server
	os.Exit(m.Run())
}

// A pod gets its namespace, its veth with every address, a server that
// answers on each, and Delete leaves nothing of it.
func TestKernelPodNetwork(t *testing.T) {
	testenv.RequireRoot(t)
	own, err := cgroup2.Own()
	if err != nil {
		t.Fatal(err)
	}
	parent, err := os.MkdirTemp(own, "testpod-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(parent) })
	p, err := Create(Options{Subnet: 251, CgroupParent: parent, Addresses: 3})
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = p.Delete()
		}
	})
	host, err := netlink.LinkByName(p.hostLink)
	if err != nil {
		t.Fatal(err)
	}
	if host.Attrs().OperState != netlink.OperUp {
		t.Errorf("%s is %s, want up", p.hostLink, host.Attrs().OperState)
	}
	if err := p.Start(RoleHTTP, HTTPPort); err != nil {
		t.Fatal(err)
	}
	for _, ip := range p.IPs {
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/", ip, HTTPPort))
		if err != nil {
			t.Fatalf("pod address %s: %v", ip, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	if err := p.Delete(); err != nil {
		t.Fatal(err)
	}
	deleted = true
	names, err := namedns.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if name == p.Name {
			t.Errorf("netns %s left", p.Name)
		}
	}
	if _, err := netlink.LinkByName(p.hostLink); !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Errorf("link %s left (%v)", p.hostLink, err)
	}
}
