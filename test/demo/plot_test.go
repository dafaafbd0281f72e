package main

import (
	"bytes"
	"image/png"
	"testing"
	"time"
)

// TestWritePNG draws a known timeline and checks where its marks land.
func TestWritePNG(t *testing.T) {
	var samples []Sample
	for i := range 61 {
		s := Sample{At: time.Duration(i) * time.Second, Offered: 10, Observed: 10, Desired: 2, Ready: 2, Mode: "Serve"}
		if i >= 30 {
			s.Offered, s.Panicking = 20, true
		}
		samples = append(samples, s)
	}
	var buf bytes.Buffer
	if err := WritePNG(&buf, "test", samples); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatalf("not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != plotW || b.Dy() != plotH {
		t.Fatalf("size %v, want %dx%d", b, plotW, plotH)
	}
	same := func(x, y int, want any) bool {
		r, g, b, _ := img.At(x, y).RGBA()
		wr, wg, wb, _ := want.(interface{ RGBA() (r, g, b, a uint32) }).RGBA()
		return r == wr && g == wg && b == wb
	}
	// The offered line sits at 10 of an axis up to 20 in the first half:
	// half the panel's height.
	xq := marginL + (plotW-marginL-marginR)/4
	if !same(xq, topY+panelH/2, colOffered) && !same(xq, topY+panelH/2, colObserved) {
		t.Errorf("no concurrency line at (%d,%d)", xq, topY+panelH/2)
	}
	// The second half is panicking: shaded red in both panels away from lines.
	x3 := marginL + 3*(plotW-marginL-marginR)/4
	if !same(x3, topY+5, colPanic) || !same(x3, bottomY+5, colPanic) {
		t.Errorf("panic band missing at x=%d", x3)
	}
	if same(xq, topY+5, colPanic) {
		t.Errorf("panic band drawn before the panic at x=%d", xq)
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{1: 1, 1.5: 2, 3: 5, 7: 10, 45: 50, 101: 200} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
