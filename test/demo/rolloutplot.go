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
)

// Colours of the rollout plot.
var (
	colScheduled = color.RGBA{0x1f, 0x77, 0xb4, 0xff}
	colMeasured  = color.RGBA{0xff, 0x7f, 0x0e, 0xff}
	colPodsV1    = color.RGBA{0x7f, 0x7f, 0x7f, 0xff}
	colPodsV2    = color.RGBA{0x94, 0x67, 0xbd, 0xff}
)

// dotSize is a measured point's side in pixels.
const dotSize = 5

// point is a corner of a line or a dot of the rollout plot: a time from
// the template change and a value.
type point struct {
	At time.Duration
	V  float64
}

// rolloutDrawing is what the rollout plot draws, in data units: the
// plot's time span, v2's scheduled percent as the corners of a step line,
// v2's measured share of each second's connections as dots (at the
// second's middle), each revision's ready pods as step lines, and the
// markers within the span.
type rolloutDrawing struct {
	From, To       time.Duration
	Scheduled      []point
	Measured       []point
	PodsV1, PodsV2 []point
	// MaxPods is the pods axis' top: a multiple of 4, so its four grid
	// lines fall on whole pods.
	MaxPods float64
	Markers []Marker
}

// drawRollout turns the record into what the plot draws: the span is
// from the first measured second (or sample) to the record's end.
func drawRollout(r *rolloutRecord) rolloutDrawing {
	d := rolloutDrawing{MaxPods: 4}
	first := true
	extend := func(at time.Duration) {
		if first {
			d.From, d.To, first = at, at, false
			return
		}
		d.From, d.To = min(d.From, at), max(d.To, at)
	}
	for _, s := range r.Seconds {
		extend(s.At)
		extend(s.At + time.Second)
	}
	for _, p := range r.Pods {
		extend(p.At)
	}
	if first {
		return d // nothing measured
	}
	if r.End > d.To {
		d.To = r.End
	}
	if d.To <= d.From {
		d.To = d.From + time.Second
	}
	var sched, v1, v2 []point
	for _, st := range r.Steps {
		sched = append(sched, point{st.At, float64(st.V2)})
	}
	maxPods := 0
	for _, p := range r.Pods {
		v1, v2 = append(v1, point{p.At, float64(p.V1)}), append(v2, point{p.At, float64(p.V2)})
		maxPods = max(maxPods, p.V1, p.V2)
	}
	d.Scheduled = stepCorners(sched, d.From, d.To)
	d.PodsV1, d.PodsV2 = stepCorners(v1, d.From, d.To), stepCorners(v2, d.From, d.To)
	d.MaxPods = max(4, 4*math.Ceil(float64(maxPods)/4))
	for _, s := range r.Seconds {
		if n := s.answered(); n > 0 {
			d.Measured = append(d.Measured, point{s.At + time.Second/2, 100 * float64(s.V2) / float64(n)})
		}
	}
	for _, m := range r.Markers {
		if m.At >= d.From && m.At <= d.To {
			d.Markers = append(d.Markers, m)
		}
	}
	return d
}

// stepCorners draws values that hold from one change to the next as a
// step line within [from, to]: a corner where each change starts (the old
// value, then the new one), the value in effect at from first and the
// last one carried to to. Changes that keep the value add no corner.
func stepCorners(changes []point, from, to time.Duration) []point {
	var out []point
	for i, c := range changes {
		if c.At > to {
			break
		}
		if i+1 < len(changes) && changes[i+1].At <= from {
			continue // replaced before the span starts
		}
		at := max(c.At, from)
		if n := len(out); n > 0 {
			if out[n-1].V == c.V {
				continue
			}
			out = append(out, point{at, out[n-1].V})
		}
		out = append(out, point{at, c.V})
	}
	if n := len(out); n > 0 && out[n-1].At < to {
		out = append(out, point{to, out[n-1].V})
	}
	return out
}

// WriteRolloutPNG draws the rollout scene in two panels sharing the time
// axis (seconds from the template change): v2's scheduled percent as a
// step line and its measured share of each second's new connections as
// dots above, each revision's ready pods below; markers are dashed
// vertical lines.
func WriteRolloutPNG(w io.Writer, title string, r *rolloutRecord) error {
	d := drawRollout(r)
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, marginL, 20, colAxis, title)
	if d.To <= d.From {
		text(img, marginL, topY+20, colAxis, "nothing measured")
		return png.Encode(w, img)
	}
	x := func(at time.Duration) int {
		return marginL + int(float64(plotW-marginL-marginR)*(at-d.From).Seconds()/(d.To-d.From).Seconds())
	}
	y := func(top int, maxV, v float64) int { return top + panelH - int(math.Round(float64(panelH)*v/maxV)) }
	for _, p := range []struct {
		top   int
		max   float64
		label string
	}{{topY, 100, r.V2 + "'s share of new connections (%)"}, {bottomY, d.MaxPods, "ready pods"}} {
		spanAxes(img, p.top, p.max, d.From, d.To, x, p.label)
		for _, m := range d.Markers {
			dashed(img, x(m.At), p.top, p.top+panelH, colMarker)
		}
	}
	for i, m := range d.Markers {
		lx := x(m.At) + 4
		if w := 7 * len(m.Label); lx+w > plotW-marginR {
			lx = x(m.At) - 4 - w
		}
		text(img, lx, topY+14+14*(i%2), colMarker, m.Label)
	}
	polyline := func(top int, maxV float64, ps []point, c color.Color) {
		for i := 1; i < len(ps); i++ {
			line(img, x(ps[i-1].At), y(top, maxV, ps[i-1].V), x(ps[i].At), y(top, maxV, ps[i].V), c)
		}
	}
	polyline(bottomY, d.MaxPods, d.PodsV1, colPodsV1)
	polyline(bottomY, d.MaxPods, d.PodsV2, colPodsV2)
	polyline(topY, 100, d.Scheduled, colScheduled)
	for _, p := range d.Measured {
		cx, cy := x(p.At), y(topY, 100, p.V)
		draw.Draw(img, image.Rect(cx-dotSize/2, cy-dotSize/2, cx+dotSize/2+1, cy+dotSize/2+1), image.NewUniform(colMeasured), image.Point{}, draw.Src)
	}

	lx, ly := marginL, legendY
	for _, l := range []struct {
		c    color.Color
		name string
	}{{colScheduled, "scheduled: " + r.V2 + "'s percent in the Route's status.traffic"}, {colMeasured, "measured: its share of each second's new connections"},
		{colPodsV1, r.V1 + " ready pods"}, {colPodsV2, r.V2 + " ready pods"}} {
		width := 24 + 7*len(l.name) + 12
		if lx+width > plotW-marginR {
			lx, ly = marginL, ly+20
		}
		draw.Draw(img, image.Rect(lx, ly-8, lx+16, ly+2), image.NewUniform(l.c), image.Point{}, draw.Src)
		text(img, lx+20, ly+2, colAxis, l.name)
		lx += width
	}
	return png.Encode(w, img)
}

// spanAxes draws a panel's frame, horizontal grid lines with values, and
// time ticks on the multiples of a tick step within [from, to] (0 among
// them when it is in the span).
func spanAxes(img *image.RGBA, top int, maxV float64, from, to time.Duration, x func(time.Duration) int, label string) {
	left, right, bottom := marginL, plotW-marginR, top+panelH
	for i := 0; i <= 4; i++ {
		yy := bottom - i*panelH/4
		hline(img, left, right, yy, colGrid)
		text(img, 4, yy+4, colAxis, trimFloat(maxV*float64(i)/4))
	}
	hline(img, left, right, bottom, colAxis)
	vline(img, left, top, bottom, colAxis)
	text(img, left+4, top-4, colAxis, label)
	step := tickStep(to - from)
	for t := from.Truncate(step); t <= to; t += step {
		if t < from {
			continue
		}
		xx := x(t)
		vline(img, xx, bottom, bottom+4, colAxis)
		text(img, xx-8, bottom+16, colAxis, fmt.Sprintf("%ds", int(t.Seconds())))
	}
}
