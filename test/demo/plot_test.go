package main

import (
	"bytes"
	"image/png"
	"testing"
	"time"
)

// TestWritePNG draws a known timeline and checks where its marks land:
// serving 0-20 s, panicking 20-40 s, then at zero in Proxy mode with
// 20 requests held by the activators at 50 s (a marker at 45 s).
func TestWritePNG(t *testing.T) {
	var samples []Sample
	for i := range 61 {
		s := Sample{At: time.Duration(i) * time.Second, Offered: 10, Observed: 10, Desired: 2, Ready: 2, Mode: "Serve"}
		switch {
		case i >= 40:
			s.Offered, s.Observed, s.Desired, s.Ready, s.Mode = 0, 0, 0, 0, "Proxy"
			if i == 50 {
				s.Held = 20
			}
		case i >= 20:
			s.Offered, s.Panicking = 20, true
		}
		samples = append(samples, s)
	}
	var buf bytes.Buffer
	if err := WritePNG(&buf, "test", samples, []Marker{{At: 45 * time.Second, Label: "20 requests at zero"}}); err != nil {
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
	x := func(s int) int { return marginL + (plotW-marginL-marginR)*s/60 }
	// The offered line sits at 10 of an axis up to 20 at 10 s: half the
	// panel's height.
	if !same(x(10), topY+panelH/2, colOffered) && !same(x(10), topY+panelH/2, colObserved) {
		t.Errorf("no concurrency line at (%d,%d)", x(10), topY+panelH/2)
	}
	// 2 ready pods of an axis up to 4 (whole pods): half the lower panel.
	if !same(x(10), bottomY+panelH/2, colReady) && !same(x(10), bottomY+panelH/2, colDesired) {
		t.Errorf("no pods line at (%d,%d)", x(10), bottomY+panelH/2)
	}
	// 20-40 s is panicking: shaded red in both panels away from lines.
	if !same(x(30), topY+5, colPanic) || !same(x(30), bottomY+5, colPanic) {
		t.Errorf("panic band missing at x=%d", x(30))
	}
	if same(x(10), topY+5, colPanic) {
		t.Errorf("panic band drawn before the panic at x=%d", x(10))
	}
	// From 40 s Proxy mode: shaded blue in both panels.
	if !same(x(43), topY+5, colProxy) || !same(x(43), bottomY+5, colProxy) {
		t.Errorf("Proxy band missing at x=%d", x(43))
	}
	// The held requests peak at the top of the concurrency axis (20).
	if !same(x(50), topY, colHeld) {
		t.Errorf("held line not at its peak (%d,%d)", x(50), topY)
	}
	// The marker is a dashed line through both panels.
	for _, y := range []int{topY + 2, bottomY + panelH/2 + 1} {
		if !same(x(45), y, colMarker) {
			t.Errorf("marker missing at (%d,%d)", x(45), y)
		}
	}
}

func TestNiceCeil(t *testing.T) {
	for in, want := range map[float64]float64{1: 1, 1.5: 2, 3: 5, 7: 10, 45: 50, 101: 200} {
		if got := niceCeil(in); got != want {
			t.Errorf("niceCeil(%v) = %v, want %v", in, got, want)
		}
	}
}
