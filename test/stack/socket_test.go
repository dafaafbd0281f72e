package stack

import (
	"net/netip"
	"runtime"
	"testing"
)

func TestProcTCPDest(t *testing.T) {
	table := []byte(`  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1111 1 0000000000000000 100 0 0 10 0
   1: 0A00000A:9C40 0A00600A:0050 01 00000000:00000000 00:00000000 00000000     0        0 2222 1 0000000000000000 20 4 30 10 -1
`)
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skipf("the table is written as a little-endian host prints it, not %s", runtime.GOARCH)
	}
	got, err := ProcTCPDest(table, 2222)
	if err != nil {
		t.Fatal(err)
	}
	// 0A00600A is 10.96.0.10 as a little-endian host prints it.
	want := netip.MustParseAddrPort("10.96.0.10:80")
	if got != want {
		t.Errorf("ProcTCPDest = %s, want %s", got, want)
	}
	if _, err := ProcTCPDest(table, 3333); err == nil {
		t.Error("ProcTCPDest found a socket that is not in the table")
	}
	// tcp6: fd5c:a1e:96::a port 80, each 32-bit word as a little-endian
	// host prints it.
	table6 := []byte(`  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 5CFD000000000000000000000A000000:9C40 1E0A5CFD0000960000000000A0000000:0050 01 00000000:00000000 00:00000000 00000000     0        0 4444 1 0000000000000000 20 4 30 10 -1
`)
	got, err = ProcTCPDest(table6, 4444)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort("[fd5c:a1e:96::a0]:80"); got != want {
		t.Errorf("ProcTCPDest(tcp6) = %s, want %s", got, want)
	}
}
