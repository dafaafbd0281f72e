package imagebuild

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// NonRoot is the unprivileged user and group of the base (the number
// distroless uses, so a cluster policy written for those images fits).
const NonRoot = 65532

// entry is one file or directory of a layer.
type entry struct {
	path string // relative, no leading slash: "etc/passwd"
	mode int64  // permission bits, setuid/sticky included
	dir  bool
	data []byte
}

// layer makes a deterministic tar layer of entries: sorted by path, owned
// by root, every time set to epoch. The same entries and epoch give the same bytes,
// hence the same digest.
func layer(entries []entry, epoch time.Time) (v1.Layer, error) {
	sorted := append([]entry(nil), entries...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].path < sorted[j].path })
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range sorted {
		// Uid, Gid 0 and no names; the format left to the writer (USTAR
		// for these short names, times rounded to seconds): the bytes
		// depend on the entry alone.
		h := &tar.Header{Name: e.path, Mode: e.mode, ModTime: epoch.UTC(), Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.dir {
			h.Name, h.Typeflag, h.Size = e.path+"/", tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("tar header %s: %w", e.path, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("tar %s: %w", e.path, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// baseEntries is the base every image starts from: root and the nonroot
// user (65532) with their groups, and a world-writable sticky /tmp. Static
// Go binaries need nothing else (no libc, no certificates: the components
// only talk TLS with the cluster's CA, which they get from their volumes).
func baseEntries() []entry {
	return []entry{
		{path: "etc", mode: 0o755, dir: true},
		{path: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf(
			"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRoot, NonRoot))},
		{path: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRoot))},
		{path: "home", mode: 0o755, dir: true},
		{path: "home/nonroot", mode: 0o700, dir: true},
		{path: "root", mode: 0o700, dir: true},
		{path: "tmp", mode: 0o1777, dir: true},
	}
}

// binaryLayer is a layer with one executable at /<name>.
func binaryLayer(path, name string, epoch time.Time) (v1.Layer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	return layer([]entry{{path: name, mode: 0o755, data: b}}, epoch)
}
