package bpf

import (
	"errors"
	"strings"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

func TestScratchLoad(t *testing.T) {
	spec, err := loadAccounting()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sockscale_sockops", "sockscale_ingress", "sockscale_egress"} {
		ps := spec.Programs[name]
		_ = ps
	}
	coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelBranch, LogSizeStart: 1 << 30}})
	if err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			os.WriteFile("/tmp/verifier.log", []byte(strings.Join(verr.Log, "\n")), 0644)
		}
		_ = fmt.Sprint
		var ve *ebpf.VerifierError
		if e, ok := err.(interface{ Unwrap() error }); ok {
			_ = e
		}
		_ = ve
		t.Fatal("see log")
	}
	for n, p := range coll.Programs {
		t.Logf("%s: %s", n, p.VerifierLog[len(p.VerifierLog)-min(300, len(p.VerifierLog)):])
	}
	coll.Close()
}
