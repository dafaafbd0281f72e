package main

import (
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"regexp"
	"strings"
	"unicode"
)

// Problem is one failed check, at a line of a file.
type Problem struct {
	File string
	Line int
	Link string // empty for a check of the whole file
	Why  string
}

func (p Problem) String() string {
	if p.Link == "" {
		return fmt.Sprintf("%s:%d: %s", p.File, p.Line, p.Why)
	}
	return fmt.Sprintf("%s:%d: link %q: %s", p.File, p.Line, p.Link, p.Why)
}

// Check checks the markdown files (slash paths relative to fsys's root):
// README.md at most readmeMax lines, and every relative link of each file.
func Check(fsys fs.FS, files []string, readmeMax int) ([]Problem, error) {
	var problems []Problem
	anchors := map[string]map[string]bool{} // file -> its heading ids, read once
	headingIDs := func(file string) (map[string]bool, error) {
		if ids, ok := anchors[file]; ok {
			return ids, nil
		}
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		ids := map[string]bool{}
		for _, id := range HeadingIDs(string(b)) {
			ids[id] = true
		}
		anchors[file] = ids
		return ids, nil
	}
	for _, file := range files {
		b, err := fs.ReadFile(fsys, file)
		if err != nil {
			return nil, err
		}
		text := string(b)
		if file == "README.md" {
			if n := countLines(text); n > readmeMax {
				problems = append(problems, Problem{File: file, Line: n, Why: fmt.Sprintf("README.md has %d lines, at most %d allowed: move reference material to docs/", n, readmeMax)})
			}
		}
		for _, l := range Links(text) {
			why := checkLink(fsys, file, l.Target, headingIDs)
			if why != "" {
				problems = append(problems, Problem{File: file, Line: l.Line, Link: l.Target, Why: why})
			}
		}
	}
	return problems, nil
}

func countLines(s string) int {
	n := strings.Count(s, "\n")
	if s != "" && !strings.HasSuffix(s, "\n") {
		n++
	}
	return n
}

var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink says why target, a link in file, does not resolve ("" if it
// does). Links with a scheme (https:, mailto:) are not checked.
func checkLink(fsys fs.FS, file, target string, headingIDs func(string) (map[string]bool, error)) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return ""
	}
	p, frag, _ := strings.Cut(target, "#")
	p, _, _ = strings.Cut(p, "?")
	if u, err := url.PathUnescape(p); err == nil {
		p = u
	}
	dest := file // a bare #anchor points into the file itself
	if p != "" {
		if strings.HasPrefix(p, "/") {
			dest = path.Clean(strings.TrimPrefix(p, "/")) // GitHub: from the repository's root
		} else {
			dest = path.Join(path.Dir(file), p)
		}
		if dest == ".." || strings.HasPrefix(dest, "../") {
			return "leads outside the repository"
		}
		info, err := fs.Stat(fsys, dest)
		if err != nil {
			return fmt.Sprintf("%s does not exist", dest)
		}
		if info.IsDir() {
			if frag != "" {
				return fmt.Sprintf("#%s points into a folder", frag)
			}
			return ""
		}
	}
	if frag == "" || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	ids, err := headingIDs(dest)
	if err != nil {
		return fmt.Sprintf("%s cannot be read: %v", dest, err)
	}
	if f, err := url.PathUnescape(frag); err == nil {
		frag = f
	}
	if !ids[strings.ToLower(frag)] {
		return fmt.Sprintf("%s has no heading #%s", dest, frag)
	}
	return ""
}

// Link is a link's target and the line it is on.
type Link struct {
	Line   int
	Target string
}

var (
	// [text](target) and ![alt](target); the target may be <...> and may
	// be followed by a title.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:"[^"]*"|'[^']*'|\([^)]*\)))?\s*\)`)
	// [label]: target at the start of a line.
	refDef = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
)

// Links returns the link targets of a markdown text, outside fenced code
// blocks and code spans.
func Links(text string) []Link {
	var links []Link
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		if f, ok := fenceMarker(line); ok {
			switch {
			case fence == "":
				fence = f
				continue
			case strings.HasPrefix(strings.TrimSpace(line), fence) && strings.Trim(strings.TrimSpace(line), fence[:1]) == "":
				fence = ""
				continue
			}
		}
		if fence != "" {
			continue
		}
		line = stripCodeSpans(line)
		if m := refDef.FindStringSubmatch(line); m != nil {
			links = append(links, Link{Line: i + 1, Target: strings.Trim(m[1], "<>")})
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
			t := strings.Trim(m[1], "<>")
			if t != "" {
				links = append(links, Link{Line: i + 1, Target: t})
			}
		}
	}
	return links
}

// fenceMarker returns the run of backticks or tildes that opens (or
// closes) a fenced code block on line.
func fenceMarker(line string) (string, bool) {
	t := strings.TrimLeft(line, " ")
	if len(line)-len(t) > 3 {
		return "", false
	}
	for _, c := range []string{"`", "~"} {
		n := len(t) - len(strings.TrimLeft(t, c))
		if n >= 3 {
			return t[:n], true
		}
	}
	return "", false
}

var (
	atxHeading     = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	setextUnder    = regexp.MustCompile(`^ {0,3}(=+|-+)[ \t]*$`)
	headingLink    = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	htmlTag        = regexp.MustCompile(`<[^>]+>`)
	explicitAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// HeadingIDs returns the ids GitHub gives the headings of a markdown
// text, in order, duplicates numbered (-1, -2, ...) as GitHub numbers
// them, and the names of explicit <a name|id="..."> anchors.
func HeadingIDs(text string) []string {
	var ids []string
	seen := map[string]int{}
	add := func(heading string) {
		base := Slug(heading)
		id := base
		if n, ok := seen[base]; ok {
			id = fmt.Sprintf("%s-%d", base, n)
			seen[base] = n + 1
		} else {
			seen[base] = 1
		}
		ids = append(ids, id)
	}
	lines := strings.Split(text, "\n")
	fence := ""
	for i, line := range lines {
		if f, ok := fenceMarker(line); ok {
			if fence == "" {
				fence = f
				continue
			}
			if strings.HasPrefix(strings.TrimSpace(line), fence) {
				fence = ""
				continue
			}
		}
		if fence != "" {
			continue
		}
		for _, m := range explicitAnchor.FindAllStringSubmatch(line, -1) {
			ids = append(ids, m[1])
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			add(m[2])
			continue
		}
		if i+1 < len(lines) && strings.TrimSpace(line) != "" && setextUnder.MatchString(lines[i+1]) &&
			!strings.HasPrefix(strings.TrimSpace(line), "|") && !strings.HasPrefix(strings.TrimSpace(line), "-") {
			add(line)
		}
	}
	return ids
}

// Slug is GitHub's id of a heading: its text as rendered (link targets
// and HTML tags dropped), lower-cased, every character that is not a
// letter, digit, mark, space, hyphen or underscore removed, and spaces
// turned into hyphens.
func Slug(heading string) string {
	s := headingLink.ReplaceAllString(strings.TrimSpace(heading), "$1")
	s = htmlTag.ReplaceAllString(s, "")
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// stripCodeSpans removes the code spans of a line: a run of backticks up
// to the next run of the same length. A run without a match is text.
func stripCodeSpans(line string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return b.String()
		}
		n := i
		for n < len(line) && line[n] == '`' {
			n++
		}
		run := line[i:n]
		end := -1
		for j := n; j < len(line); {
			k := strings.IndexByte(line[j:], '`')
			if k < 0 {
				break
			}
			k += j
			m := k
			for m < len(line) && line[m] == '`' {
				m++
			}
			if m-k == len(run) {
				end = m
				break
			}
			j = m
		}
		if end < 0 {
			b.WriteString(line[:n])
			line = line[n:]
			continue
		}
		b.WriteString(line[:i])
		line = line[end:]
	}
}
