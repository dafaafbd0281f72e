// Command pkgmap writes docs/packages.md, the map of the module's
// packages: each package's import path and the first sentence of its
// package comment, grouped by top-level folder. With -check it writes
// nothing and fails if the file differs from what it would write (make
// verify).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

func main() {
	out := flag.String("out", "docs/packages.md", "the file to write (or, with -check, to compare)")
	check := flag.Bool("check", false, "write nothing; fail if the file is not what would be written")
	flag.Parse()
	if err := run(*out, *check); err != nil {
		fmt.Fprintln(os.Stderr, "pkgmap:", err)
		os.Exit(1)
	}
}

func run(out string, check bool) error {
	mod, err := goList("-m", "-f", "{{.Path}}")
	if err != nil {
		return err
	}
	// A tab cannot occur in an import path; the doc is one line.
	list, err := goList("-f", "{{.ImportPath}}\t{{.Doc}}", "./...")
	if err != nil {
		return err
	}
	pkgs, err := parseList(strings.TrimSpace(mod), list)
	if err != nil {
		return err
	}
	want := render(pkgs)
	if !check {
		return os.WriteFile(out, want, 0o644)
	}
	have, err := os.ReadFile(out)
	if err != nil {
		return fmt.Errorf("%w; run 'go run ./hack/pkgmap' (make generate)", err)
	}
	if !bytes.Equal(have, want) {
		return fmt.Errorf("%s is out of date; run 'go run ./hack/pkgmap' (make generate) and commit", out)
	}
	return nil
}

func goList(args ...string) (string, error) {
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Stderr = os.Stderr
	b, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list %s: %w", strings.Join(args, " "), err)
	}
	return string(b), nil
}
