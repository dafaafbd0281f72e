package bpf

import (
	"hash/fnv"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// TestHeaderMatchesGo keeps accounting.h, the Go model's constants and the
// Go limits in step: the parsers match tokens by FNV-1a hash, so a constant
// that does not hash its string would silently never match.
func TestHeaderMatchesGo(t *testing.T) {
	src, err := os.ReadFile("accounting.h")
	if err != nil {
		t.Fatal(err)
	}
	defines := map[string]uint64{}
	hashed := map[string]string{}
	re := regexp.MustCompile(`(?m)^#define (\w+) (0x[0-9a-f]+|\d+)u?\s*(?://\s*"([^"]*)")?`)
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		v, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			t.Fatalf("parse %s: %v", m[1], err)
		}
		defines[m[1]] = v
		if m[3] != "" {
			hashed[m[1]] = m[3]
		}
	}
	if len(hashed) != 9 {
		t.Fatalf("found %d hashed tokens in accounting.h, want 9: %v", len(hashed), hashed)
	}
	for name, s := range hashed {
		h := fnv.New32a()
		h.Write([]byte(s))
		if got := uint64(h.Sum32()); got != defines[name] {
			t.Errorf("%s = %#x, but FNV-1a(%q) = %#x", name, defines[name], s, got)
		}
	}
	want := map[string]uint64{
		"MAX_PODS": MaxPods, "MAX_ACTIVATORS": MaxActivators, "MAX_NODE_ADDRS": MaxNodeAddrs, "MAX_LEARNED": MaxLearned, "MAX_PIPELINE": MaxPipeline,
		"SCAN_WINDOW": scanWindow, "MAX_WINDOWS": maxWindows, "MAX_METHOD": maxMethod, "SKIP_LINES": skipLinesPerStep,
		"PROOF_WINDOWS": proofWindows, "MAX_STASHED": maxStashed, "MAX_H2_STREAMS": maxH2Streams, "MAX_H2_FRAMES": maxH2Frames, "MAX_H2_STASHED": maxH2Stashed,
		"FNV_OFFSET": fnvOffset, "FNV_PRIME": fnvPrime,
		"HASH_HEAD": hashHead, "HASH_PRI": hashPRI, "HASH_USER_AGENT": hashUserAgent,
		"HASH_KUBE_PROBE": hashKubeProbe, "HASH_SOCKSCALE_PROBE": hashSockscaleProbe,
		"HASH_HTTP_VERSION": hashHTTPVersion, "HASH_CONTENT_LENGTH": hashContentLength,
		"HASH_TRANSFER_ENCODING": hashTransferEncoding, "HASH_CHUNKED": hashChunked,
	}
	for name, v := range want {
		got, ok := defines[name]
		if !ok {
			t.Errorf("accounting.h has no #define %s", name)
			continue
		}
		if got != v {
			t.Errorf("accounting.h %s = %d, Go has %d", name, got, v)
		}
	}
}
