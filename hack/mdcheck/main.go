// Command mdcheck checks the repository's markdown (make verify): the
// README stays short enough to read in minutes, and every relative link
// in every tracked *.md file leads to a file or folder of the repository
// and, for a #anchor into a markdown file, to one of its headings (by
// GitHub's rules for heading ids). Each failure is printed as
// file:line: link: why.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	readmeMax := flag.Int("readme-max-lines", 320, "the most lines README.md may have")
	flag.Parse()
	files := flag.Args()
	if len(files) == 0 {
		var err error
		if files, err = markdownFiles(*root); err != nil {
			fmt.Fprintln(os.Stderr, "mdcheck:", err)
			os.Exit(1)
		}
	}
	problems, err := Check(os.DirFS(*root), files, *readmeMax)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mdcheck:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(os.Stderr, "mdcheck: %d problem(s) in %d markdown files\n", len(problems), len(files))
		os.Exit(1)
	}
}

// markdownFiles lists the *.md files git tracks, and those it would track
// (new, not ignored), relative to root.
func markdownFiles(root string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "*.md")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %w", err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\n") {
		if f != "" {
			files = append(files, f)
		}
	}
	return files, nil
}
