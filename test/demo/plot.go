package main

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"io"
	"math"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Sample is one row of the demo's timeline.
type Sample struct {
	At                time.Duration
	Offered, Observed float64
	// Held is the most requests the activators held at once since the
	// last row (-1: unknown).
	Held           float64
	Desired, Ready int32
	Mode           string
	Panicking      bool
}

// Marker is a moment of the scenario, drawn as a labelled vertical line.
type Marker struct {
	At    time.Duration
	Label string
}

// Colours of the plot, one per series.
var (
	colOffered  = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	colObserved = color.RGBA{0xff, 0x7f, 0x0e, 0xff}
	colDesired  = color.RGBA{0x2c, 0xa0, 0x2c, 0xff}
	colReady    = color.RGBA{0x94, 0x67, 0xbd, 0xff}
	colHeld     = color.RGBA{0x8c, 0x56, 0x4b, 0xff}
	colMarker   = color.RGBA{0x77, 0x77, 0x77, 0xff}
	colPanic    = color.RGBA{0xfd, 0xd8, 0xd8, 0xff}
	colProxy    = color.RGBA{0xdd, 0xe8, 0xf7, 0xff}
	colAxis     = color.RGBA{0x33, 0x33, 0x33, 0xff}
	colGrid     = color.RGBA{0xe4, 0xe4, 0xe4, 0xff}
)

const (
	plotW, plotH   = 1000, 660
	marginL        = 60
	marginR        = 20
	panelH         = 240
	topY, bottomY  = 40, 40 + panelH + 60
	legendY        = bottomY + panelH + 30
	lineThickness  = 2
	minAxisMaximum = 1.0
)

// WritePNG draws the timeline as two panels sharing the time axis: the
// offered and observed concurrency and the requests held by the
// activators on top, desired and ready pods below; panic is shaded red and
// Proxy mode blue behind both, markers are dashed vertical lines.
func WritePNG(w io.Writer, title string, samples []Sample, markers []Marker) error {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, marginL, 20, colAxis, title)
	if len(samples) == 0 {
		text(img, marginL, topY+20, colAxis, "no samples")
		return png.Encode(w, img)
	}
	end := samples[len(samples)-1].At
	if end <= 0 {
		end = time.Second
	}
	x := func(at time.Duration) int {
		return marginL + int(float64(plotW-marginL-marginR)*at.Seconds()/end.Seconds())
	}
	maxConc, maxPods := minAxisMaximum, minAxisMaximum
	for _, s := range samples {
		maxConc = math.Max(maxConc, math.Max(s.Offered, math.Max(s.Observed, s.Held)))
		maxPods = math.Max(maxPods, float64(max(s.Desired, s.Ready)))
	}
	// Pods are whole: their axis is a multiple of 4, so the four grid
	// lines fall on whole pods (6 pods at most => 8, not 10 with 2.5s).
	maxConc, maxPods = niceCeil(maxConc), 4*math.Ceil(maxPods/4)

	for _, panel := range []struct {
		top   int
		max   float64
		label string
	}{{topY, maxConc, "concurrency"}, {bottomY, maxPods, "pods"}} {
		// Mode and panic bands first, so the lines are drawn over them.
		for i := 1; i < len(samples); i++ {
			s := samples[i]
			band := color.Color(nil)
			switch {
			case s.Panicking:
				band = colPanic
			case s.Mode == "Proxy":
				band = colProxy
			}
			if band != nil {
				draw.Draw(img, image.Rect(x(samples[i-1].At), panel.top, x(s.At)+1, panel.top+panelH), image.NewUniform(band), image.Point{}, draw.Src)
			}
		}
		axes(img, panel.top, panel.max, end, panel.label)
		for _, m := range markers {
			if m.At >= 0 && m.At <= end {
				dashed(img, x(m.At), panel.top, panel.top+panelH, colMarker)
			}
		}
	}
	for i, m := range markers {
		if m.At >= 0 && m.At <= end {
			// Labels alternate between two lines, so close markers stay
			// readable; near the right edge a label goes left of its line.
			lx := x(m.At) + 4
			if w := 7 * len(m.Label); lx+w > plotW-marginR {
				lx = x(m.At) - 4 - w
			}
			text(img, lx, topY+14+14*(i%2), colMarker, m.Label)
		}
	}
	y := func(top int, maxV, v float64) int { return top + panelH - int(float64(panelH)*v/maxV) }
	series := func(top int, maxV float64, c color.Color, value func(Sample) float64) {
		for i := 1; i < len(samples); i++ {
			a, b := samples[i-1], samples[i]
			line(img, x(a.At), y(top, maxV, value(a)), x(b.At), y(top, maxV, value(b)), c)
		}
	}
	series(topY, maxConc, colOffered, func(s Sample) float64 { return s.Offered })
	series(topY, maxConc, colObserved, func(s Sample) float64 { return s.Observed })
	series(topY, maxConc, colHeld, func(s Sample) float64 { return math.Max(s.Held, 0) })
	series(bottomY, maxPods, colDesired, func(s Sample) float64 { return float64(s.Desired) })
	series(bottomY, maxPods, colReady, func(s Sample) float64 { return float64(s.Ready) })

	lx, ly := marginL, legendY
	for _, l := range []struct {
		c    color.Color
		name string
	}{{colOffered, "offered concurrency"}, {colObserved, "observed (stable window)"}, {colHeld, "held by activators (peak)"},
		{colDesired, "desired pods"}, {colReady, "ready pods"}, {colPanic, "panic"}, {colProxy, "Proxy mode"}} {
		width := 24 + 7*len(l.name) + 12
		if lx+width > plotW-marginR { // next legend line
			lx, ly = marginL, ly+20
		}
		draw.Draw(img, image.Rect(lx, ly-8, lx+16, ly+2), image.NewUniform(l.c), image.Point{}, draw.Src)
		text(img, lx+20, ly+2, colAxis, l.name)
		lx += width
	}
	return png.Encode(w, img)
}

// axes draws a panel's frame, horizontal grid lines with values, and time
// ticks.
func axes(img *image.RGBA, top int, maxV float64, end time.Duration, label string) {
	left, right, bottom := marginL, plotW-marginR, top+panelH
	for i := 0; i <= 4; i++ {
		yy := bottom - i*panelH/4
		hline(img, left, right, yy, colGrid)
		text(img, 4, yy+4, colAxis, trimFloat(maxV*float64(i)/4))
	}
	hline(img, left, right, bottom, colAxis)
	vline(img, left, top, bottom, colAxis)
	text(img, left+4, top-4, colAxis, label)
	step := tickStep(end)
	for t := time.Duration(0); t <= end; t += step {
		xx := left + int(float64(right-left)*t.Seconds()/end.Seconds())
		vline(img, xx, bottom, bottom+4, colAxis)
		text(img, xx-8, bottom+16, colAxis, fmt.Sprintf("%ds", int(t.Seconds())))
	}
}

// tickStep picks a time tick so that about 10 ticks fit.
func tickStep(end time.Duration) time.Duration {
	for _, s := range []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute} {
		if end/s <= 10 {
			return s
		}
	}
	return 10 * time.Minute
}

// niceCeil rounds an axis maximum up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func text(img *image.RGBA, x, y int, c color.Color, s string) {
	d := &font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

func hline(img *image.RGBA, x0, x1, y int, c color.Color) {
	for x := x0; x <= x1; x++ {
		img.Set(x, y, c)
	}
}

func vline(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		img.Set(x, y, c)
	}
}

// dashed draws a vertical dashed line, 4 pixels on, 4 off.
func dashed(img *image.RGBA, x, y0, y1 int, c color.Color) {
	for y := y0; y <= y1; y++ {
		if (y-y0)%8 < 4 {
			img.Set(x, y, c)
		}
	}
}

// line draws a thick segment (Bresenham, stamped lineThickness wide).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.Color) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		for ox := range lineThickness {
			for oy := range lineThickness {
				img.Set(x0+ox, y0+oy, c)
			}
		}
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}
