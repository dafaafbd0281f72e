package main

import (
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Beyond one leader: sharding targets across replicas": "beyond-one-leader-sharding-targets-across-replicas",
		"Proxy/Serve switch (TestE2ESocketRedirectSwitching)": "proxyserve-switch-teste2esocketredirectswitching",
		"`make demo` and `make test`":                         "make-demo-and-make-test",
		"The `--socket_redirect` flag":                        "the---socket_redirect-flag",
		"[Install](#install) with helm":                       "install-with-helm",
		"Data path: 1,000 targets, p50 / p99":                 "data-path-1000-targets-p50--p99",
		"Größe und Übersicht":                                 "größe-und-übersicht",
		"  Trailing spaces  ":                                 "trailing-spaces",
		"Upgrade <em>and</em> uninstall":                      "upgrade-and-uninstall",
	} {
		if got := Slug(heading); got != want {
			t.Errorf("Slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

func TestHeadingIDs(t *testing.T) {
	text := "# Title\n\n## Runs\n\ntext\n\n## Runs\n\n### Runs ###\n\n```\n# not a heading\n```\n\nSetext\n------\n\n| a | b |\n|---|---|\n\n<a name=\"custom\"></a>\n#hashtag is not a heading\n"
	got := HeadingIDs(text)
	want := []string{"title", "runs", "runs-1", "runs-2", "setext", "custom"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("HeadingIDs = %q, want %q", got, want)
	}
}

func TestLinks(t *testing.T) {
	text := strings.Join([]string{
		"See [the docs](docs/a.md) and ![a plot](out/p.png \"title\").", // 1
		"Code `[not](a-link.md)` and ``[nor](this.md)`` here.",          // 2
		"```sh",                         // 3
		"[inside](a-fence.md)",          // 4
		"```",                           // 5
		"[ref]: docs/b.md#part",         // 6
		"[nested [brackets]](<c d.md>)", // 7
		"[web](https://example.com) [self](#top)", // 8
	}, "\n")
	got := Links(text)
	want := []Link{
		{1, "docs/a.md"}, {1, "out/p.png"}, {6, "docs/b.md#part"}, {7, "c d.md"},
		{8, "https://example.com"}, {8, "#top"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Links = %v, want %v", got, want)
	}
}

func TestCheck(t *testing.T) {
	fsys := fstest.MapFS{
		"README.md": {Data: []byte("# sockscale\n\n## Install\n\n" +
			"[ok](docs/a.md) [ok anchor](docs/a.md#the-table) [ok dir](agent)\n" +
			"[missing](docs/gone.md)\n" +
			"[bad anchor](docs/a.md#no-such-heading)\n" +
			"[self ok](#install) [self bad](#uninstall)\n" +
			"[outside](../elsewhere/x.md) [web](https://example.com/x.md#y)\n" +
			"[root](/docs/a.md#runs-1)\n")},
		"docs/a.md":          {Data: []byte("# A\n\n## The table\n\n## Runs\n\n## Runs\n\n[up](../README.md#install) [img](plot.png)\n")},
		"agent/main.go":      {Data: []byte("package main\n")},
		"docs/plot.png":      {Data: []byte{0}},
		"test/README.md":     {Data: []byte("[dir anchor](../agent#x)\n")},
		"charts/x/README.md": {Data: []byte("[ok](../../docs/a.md)\n")},
	}
	problems, err := Check(fsys, []string{"README.md", "docs/a.md", "test/README.md", "charts/x/README.md"}, 5)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range problems {
		got = append(got, p.String())
	}
	want := []string{
		"README.md:10: README.md has 10 lines, at most 5 allowed: move reference material to docs/",
		`README.md:6: link "docs/gone.md": docs/gone.md does not exist`,
		`README.md:7: link "docs/a.md#no-such-heading": docs/a.md has no heading #no-such-heading`,
		`README.md:8: link "#uninstall": README.md has no heading #uninstall`,
		`README.md:9: link "../elsewhere/x.md": leads outside the repository`,
		`test/README.md:1: link "../agent#x": #x points into a folder`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
