package memlimit

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string // under the fake cgroupfs; "self" is /proc/self/cgroup
		want  int64
		err   string
	}{
		{name: "namespaced container", files: map[string]string{"memory.max": "268435456\n", "self": "0::/\n"}, want: 256 << 20},
		{name: "own path wins over the root", files: map[string]string{"memory.max": "max\n", "kubepods/pod1/c1/memory.max": "1073741824\n", "self": "0::/kubepods/pod1/c1\n"}, want: 1 << 30},
		{name: "no limit", files: map[string]string{"memory.max": "max\n", "self": "0::/\n"}, want: 0},
		{name: "no cgroup v2", files: map[string]string{"self": "12:memory:/x\n"}, want: 0},
		{name: "garbage", files: map[string]string{"memory.max": "lots\n"}, err: `holds "lots", want a positive byte count or "max"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			fs, self := filepath.Join(dir, "cgroup"), filepath.Join(dir, "self-cgroup")
			for name, data := range tc.files {
				if name == "self" {
					write(t, self, data)
				} else {
					write(t, filepath.Join(fs, name), data)
				}
			}
			got, err := CgroupLimit(fs, self)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want it to say %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("CgroupLimit = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

func TestSetAppliesAFractionUnlessGOMEMLIMIT(t *testing.T) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	dir := t.TempDir()
	write(t, filepath.Join(dir, "memory.max"), "1000000000\n")
	t.Setenv("GOMEMLIMIT", "")
	got, err := Set(dir, filepath.Join(dir, "none"))
	if err != nil || got != 900_000_000 {
		t.Fatalf("Set = %d, %v; want 900000000", got, err)
	}
	if now := debug.SetMemoryLimit(-1); now != 900_000_000 {
		t.Errorf("runtime limit %d, want 900000000", now)
	}
	t.Setenv("GOMEMLIMIT", "500MiB")
	if got, err := Set(dir, filepath.Join(dir, "none")); got != 0 || err != nil {
		t.Errorf("with GOMEMLIMIT set: Set = %d, %v; want 0, nil (the variable wins)", got, err)
	}
}
