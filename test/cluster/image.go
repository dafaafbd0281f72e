package cluster

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"

	"github.com/sockscale/sockscale/internal/imagebuild"
)

// The node simulator pulls images like a kubelet: it resolves the pod's
// reference (tag or digest) against its registry, keeps each image
// unpacked under <state>/images/<digest> (one cache for every simulated
// node), and runs the container's process from that root filesystem.

// pullTimeout bounds one pull: a registry that does not answer is an
// ErrImagePull, not a pod that hangs in ContainerCreating.
const pullTimeout = 2 * time.Minute

// pulledImage is an image unpacked on the node.
type pulledImage struct {
	// ID is repository@digest, the container status' imageID.
	ID     string
	Rootfs string
	Config v1.Config
}

type imageStore struct {
	dir string // <state>/images

	mu    sync.Mutex
	locks map[string]*sync.Mutex // per reference: one pull at a time
}

func newImageStore(dir string) *imageStore {
	return &imageStore{dir: dir, locks: map[string]*sync.Mutex{}}
}

func (s *imageStore) lock(ref string) func() {
	s.mu.Lock()
	l, ok := s.locks[ref]
	if !ok {
		l = &sync.Mutex{}
		s.locks[ref] = l
	}
	s.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// refFile remembers the digest a reference resolved to (IfNotPresent and
// Never use it without asking the registry).
func (s *imageStore) refFile(image string) string {
	h := sha256.Sum256([]byte(image))
	return filepath.Join(s.dir, "refs", hex.EncodeToString(h[:]))
}

func (s *imageStore) digestDir(d v1.Hash) string {
	return filepath.Join(s.dir, d.Algorithm+"-"+d.Hex)
}

// errNeverPull: policy Never and the image is not on the node.
var errNeverPull = errors.New("image is not present and the pull policy is Never")

// get returns image unpacked, pulling it as policy says: IfNotPresent uses
// the digest the reference resolved to before, if its image is still
// here; Always resolves the reference again (and downloads only a digest
// not here yet); Never only uses what is here.
func (s *imageStore) get(ctx context.Context, image string, policy corev1.PullPolicy) (*pulledImage, error) {
	defer s.lock(image)()
	if policy != corev1.PullAlways {
		if b, err := os.ReadFile(s.refFile(image)); err == nil {
			var p pulledImage
			if err := json.Unmarshal(b, &p); err == nil {
				if _, err := os.Stat(p.Rootfs); err == nil {
					return &p, nil
				}
			}
		}
		if policy == corev1.PullNever {
			return nil, errNeverPull
		}
	}
	ref, err := imagebuild.ParseReference(image)
	if err != nil {
		return nil, fmt.Errorf("reference %q: %w", image, err)
	}
	ctx, cancel := context.WithTimeout(ctx, pullTimeout)
	defer cancel()
	img, err := remote.Image(ref, remote.WithContext(ctx),
		remote.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH}))
	if err != nil {
		return nil, err
	}
	d, err := img.Digest()
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image config: %w", err)
	}
	p := &pulledImage{ID: ref.Context().Digest(d.String()).String(), Rootfs: filepath.Join(s.digestDir(d), "rootfs"), Config: cf.Config}
	if _, err := os.Stat(p.Rootfs); err != nil {
		if err := s.unpack(img, s.digestDir(d)); err != nil {
			return nil, err
		}
	}
	b, _ := json.Marshal(p)
	if err := writeFile(s.refFile(image), b, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

// unpack writes img's layers into dir/rootfs through a temporary
// directory, so a rootfs that exists is complete.
func (s *imageStore) unpack(img v1.Image, dir string) error {
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.dir, "unpack-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(tmp) }()
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		err = unpackLayer(rootfs, rc)
		_ = rc.Close()
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
	}
	// Images are read by every user, as a runtime's are.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	if err := os.Rename(tmp, dir); err != nil && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
		return fmt.Errorf("image %s: %w", dir, err)
	}
	return nil
}

// unpackLayer applies one layer's tar to rootfs: entries are confined to
// rootfs (os.Root refuses any path or link that leaves it), whiteouts
// delete what lower layers made (".wh.<name>") or a directory's lower
// content (".wh..wh..opq"). Device nodes are skipped: containers see the
// host's /dev.
func unpackLayer(rootfs string, r io.Reader) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer func() { _ = root.Close() }()
	made := map[string]bool{} // entries of this layer, which an opaque whiteout keeps
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		rel := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if rel == "" {
			continue
		}
		dir, base := path.Split(rel)
		dir = strings.TrimSuffix(dir, "/")
		if dir == "" {
			dir = "."
		}
		if base == ".wh..wh..opq" {
			ents, err := fs.ReadDir(root.FS(), dir)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("opaque whiteout %s: %w", h.Name, err)
			}
			for _, e := range ents {
				if p := path.Join(dir, e.Name()); !made[p] {
					if err := root.RemoveAll(p); err != nil {
						return fmt.Errorf("opaque whiteout %s: %w", h.Name, err)
					}
				}
			}
			continue
		}
		if strings.HasPrefix(base, ".wh.") {
			if err := root.RemoveAll(path.Join(dir, strings.TrimPrefix(base, ".wh."))); err != nil {
				return fmt.Errorf("whiteout %s: %w", h.Name, err)
			}
			continue
		}
		if dir != "." {
			if err := root.MkdirAll(dir, 0o755); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		mode := h.FileInfo().Mode()
		// What a lower layer had here goes, unless both are directories
		// (then the upper one's metadata wins and the content merges).
		if fi, err := root.Lstat(rel); err == nil && (!fi.IsDir() || h.Typeflag != tar.TypeDir) {
			if err := root.RemoveAll(rel); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(rel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeReg:
			f, err := root.OpenFile(rel, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, rel); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		case tar.TypeLink:
			target := strings.TrimPrefix(path.Clean("/"+h.Linkname), "/")
			if err := root.Link(target, rel); err != nil {
				return fmt.Errorf("hard link %s to %s: %w", h.Name, h.Linkname, err)
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			continue
		default:
			return fmt.Errorf("%s: tar entry type %q is not supported (want a directory, file, symlink or hard link)", h.Name, h.Typeflag)
		}
		made[rel] = true
		if h.Typeflag == tar.TypeLink {
			continue // the target's inode: its metadata is the target's
		}
		// Only root may give files away (the simulator is root; an
		// unprivileged unit test keeps its own).
		if err := root.Lchown(rel, h.Uid, h.Gid); err != nil && os.Geteuid() == 0 {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		if h.Typeflag != tar.TypeSymlink {
			// After the owner: chown clears setuid and setgid.
			if err := root.Chmod(rel, mode&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
			if err := root.Chtimes(rel, h.ModTime, h.ModTime); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
	}
}

// containerArgv is the process's argv as a kubelet makes it: command
// replaces the image's Entrypoint and then its Cmd is dropped too; args
// replace Cmd.
func containerArgv(command, args []string, cfg v1.Config) ([]string, error) {
	var argv []string
	switch {
	case len(command) > 0:
		argv = append(append(argv, command...), args...)
	case len(args) > 0:
		argv = append(append(argv, cfg.Entrypoint...), args...)
	default:
		argv = append(append(argv, cfg.Entrypoint...), cfg.Cmd...)
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("no command: the container sets no command and its image has no Entrypoint or Cmd")
	}
	return argv, nil
}

// imageUser resolves the image config's User ("uid", "uid:gid", "name",
// "name:group"; names from the image's /etc/passwd and /etc/group) to
// numbers; an empty User is root.
func imageUser(rootfs, user string) (uid, gid int64, err error) {
	if user == "" {
		return 0, 0, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	uid, primary, err := lookupID(filepath.Join(rootfs, "etc", "passwd"), u, true)
	if err != nil {
		return 0, 0, fmt.Errorf("image user %q: %w", user, err)
	}
	gid = primary
	if hasGroup {
		if gid, _, err = lookupID(filepath.Join(rootfs, "etc", "group"), g, false); err != nil {
			return 0, 0, fmt.Errorf("image user %q: %w", user, err)
		}
	}
	return uid, gid, nil
}

// lookupID returns the id of name (a number or a name of the file) and,
// for passwd, the primary group (the id itself for a number not in it).
func lookupID(file, name string, passwd bool) (id, group int64, err error) {
	n, numErr := strconv.ParseInt(name, 10, 64)
	b, _ := os.ReadFile(file)
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 || (f[0] != name && f[2] != name) {
			continue
		}
		id, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			continue
		}
		group = id
		if passwd && len(f) > 3 {
			if g, err := strconv.ParseInt(f[3], 10, 64); err == nil {
				group = g
			}
		}
		return id, group, nil
	}
	if numErr == nil {
		return n, n, nil
	}
	return 0, 0, fmt.Errorf("%q is not a number and not in the image's %s", name, filepath.Base(file))
}
