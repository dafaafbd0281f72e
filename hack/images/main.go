// Command images builds the project's OCI images into an OCI layout
// (`images build`) and pushes them from there (`images push`); see
// internal/imagebuild.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sockscale/sockscale/internal/imagebuild"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("want a command: build or push")
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	out := fs.String("layout", "out/images", "the OCI image layout to write (build) or read (push)")
	chart := fs.String("chart", "charts/sockscale", "the chart whose appVersion is the images' tag")
	registry := fs.String("registry", "", "push: where to, host[:port][/path]; plain HTTP for localhost and 127.0.0.1")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "build":
		tag, err := imagebuild.ChartAppVersion(*chart)
		if err != nil {
			return err
		}
		epoch, err := imagebuild.SourceDateEpoch(ctx, ".")
		if err != nil {
			return err
		}
		built, err := imagebuild.Build(ctx, imagebuild.Options{Dir: ".", Epoch: epoch}, imagebuild.Images)
		if err != nil {
			return err
		}
		if err := imagebuild.WriteLayout(*out, built, tag); err != nil {
			return err
		}
		for _, b := range built {
			fmt.Printf("%s:%s %s\n", b.Name, tag, b.Digest)
		}
		fmt.Printf("wrote %d images to %s (epoch %s)\n", len(built), *out, epoch.Format("2006-01-02T15:04:05Z"))
		return nil
	case "push":
		imgs, err := imagebuild.ReadLayout(*out)
		if err != nil {
			return err
		}
		for _, l := range imgs {
			refs, err := imagebuild.Push(ctx, []imagebuild.Built{l.Built}, *registry, l.Tag)
			if err != nil {
				return err
			}
			fmt.Println(refs[0])
		}
		return nil
	}
	return fmt.Errorf("command %q: want build or push", args[0])
}
