// Command keda-image builds KEDA's operator image for the end-to-end
// tests ahead of them (package keda; a cold build takes minutes) and
// prints where it is: `make keda-image`.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sockscale/sockscale/test/keda"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "keda-image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	src, err := keda.FindSource(ctx)
	if err != nil {
		return err
	}
	img, err := keda.Image(ctx, src)
	if err != nil {
		return err
	}
	fmt.Printf("keda-operator:%s %s (from %s)\n", src.Version, img.Digest, src.Dir)
	return nil
}
