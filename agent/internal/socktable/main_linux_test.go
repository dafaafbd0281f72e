package socktable

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// dialerEnv makes the test binary a client process instead: "ADDR N" dials
// N connections to ADDR from the namespace it was started in, says ready,
// and holds them until its standard input closes. The benchmark's 10,000
// clients live there because this machine caps a process at 20,000 file
// descriptors and does not let even root raise that (no CAP_SYS_RESOURCE).
const dialerEnv = "SOCKTABLE_TEST_DIALER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(dialerEnv); spec != "" {
		if err := runDialer(spec); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func runDialer(spec string) error {
	addr, count, ok := strings.Cut(spec, " ")
	n, err := strconv.Atoi(count)
	if !ok || err != nil {
		return fmt.Errorf("%s=%q: want ADDR N", dialerEnv, spec)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var d net.Dialer
	conns := make([]net.Conn, 0, n)
	for range n {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	fmt.Println("ready")
	_, err = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		c.Close()
	}
	return err
}

// dialFromChild makes n connections to addr from a child process in the
// namespace h, held until the test ends.
func dialFromChild(t testing.TB, h netns.NsHandle, addr string, n int) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", dialerEnv, addr, n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The child's threads are all in the namespace of the thread that
	// started it.
	if err := inNetns(h, cmd.Start); err != nil {
		t.Fatalf("start the client process: %v", err)
	}
	t.Cleanup(func() {
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("client process: %v", err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("client process: %q %v", line, err)
	}
}
