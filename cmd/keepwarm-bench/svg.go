package main

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strings"

	"github.com/keepwarm/keepwarm/internal/benchload"
)

// A few hand-written SVG charts: enough for docs/benchmarks.md, no plotting dependency.

const (
	svgW     = 900
	svgLeft  = 150
	svgRight = 30
	svgFont  = `font-family="sans-serif" font-size="12"`
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#7f7f7f"}

type svgMark struct {
	x     float64 // in the x axis's unit
	color string
	title string
}

type svgRow struct {
	label, note string
	marks       []svgMark
}

// timelineSVG draws one row of marks per label along a shared x axis from 0 to xmax.
func timelineSVG(title, xlabel string, xmax float64, rows []svgRow, legend [][2]string) []byte {
	rowH := 34
	top := 50
	h := top + rowH*len(rows) + 70
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", svgW, h, svgW, h, svgFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", 10, html.EscapeString(title))
	plotW := float64(svgW - svgLeft - svgRight)
	xs := func(x float64) float64 { return svgLeft + x/xmax*plotW }
	for i, r := range rows {
		y := top + i*rowH + rowH/2
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, svgLeft-8, y+4, html.EscapeString(r.label))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="#ddd"/>`+"\n", svgLeft, svgW-svgRight, y, y)
		for _, m := range r.marks {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s" stroke-width="2"><title>%s</title></line>`,
				xs(m.x), xs(m.x), y-10, y+10, m.color, html.EscapeString(m.title))
		}
		if r.note != "" {
			fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" fill="#555">%s</text>`, svgLeft+2, y-12, html.EscapeString(r.note))
		}
		b.WriteString("\n")
	}
	axisY := top + rowH*len(rows) + 5
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>`, svgLeft, svgW-svgRight, axisY, axisY)
	for _, t := range ticks(0, xmax) {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="black"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`,
			xs(t), xs(t), axisY, axisY+4, xs(t), axisY+18, fmtTick(t))
	}
	fmt.Fprintf(&b, "\n"+`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", svgLeft+plotW/2, axisY+36, html.EscapeString(xlabel))
	writeLegend(&b, legend, axisY+56)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

type svgSeries struct {
	name   string
	color  string
	dashed bool
	pts    [][2]float64
}

// lineSVG draws series on linear axes.
func lineSVG(title, xlabel, ylabel string, xmin, xmax, ymin, ymax float64, series []svgSeries) []byte {
	h := 420
	top, bottom := 40, 90
	plotW := float64(svgW - svgLeft - svgRight)
	plotH := float64(h - top - bottom)
	xs := func(x float64) float64 { return svgLeft + (x-xmin)/(xmax-xmin)*plotW }
	ys := func(y float64) float64 { return float64(top) + (1-(y-ymin)/(ymax-ymin))*plotH }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", svgW, h, svgW, h, svgFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for _, t := range ticks(ymin, ymax) {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			svgLeft, svgW-svgRight, ys(t), ys(t), svgLeft-6, ys(t)+4, fmtTick(t))
	}
	for _, t := range ticks(xmin, xmax) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`, xs(t), float64(top)+plotH+18, fmtTick(t))
	}
	fmt.Fprintf(&b, "\n"+`<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="black"/>`+"\n", svgLeft, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", svgLeft+plotW/2, float64(top)+plotH+36, html.EscapeString(xlabel))
	fmt.Fprintf(&b, `<text transform="translate(%d %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", svgLeft-50, float64(top)+plotH/2, html.EscapeString(ylabel))
	var legend [][2]string
	for _, s := range series {
		var pts []string
		for _, p := range s.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xs(p[0]), ys(math.Max(ymin, math.Min(ymax, p[1])))))
		}
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", s.color, dash, strings.Join(pts, " "))
		legend = append(legend, [2]string{s.color, s.name})
	}
	writeLegend(&b, legend, h-28)
	b.WriteString("</svg>\n")
	return []byte(b.String())
}

type svgBar struct {
	label string
	value float64
	color string
	text  string
}

// barSVG draws horizontal bars on a linear axis from 0.
func barSVG(title, xlabel string, bars []svgBar) []byte {
	barH, top := 26, 44
	h := top + barH*len(bars) + 60
	xmax := 0.0
	for _, br := range bars {
		xmax = math.Max(xmax, br.value)
	}
	xmax *= 1.15
	if xmax == 0 {
		xmax = 1
	}
	left := 260
	plotW := float64(svgW - left - svgRight)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" %s>`+"\n", svgW, h, svgW, h, svgFont)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", html.EscapeString(title))
	for i, br := range bars {
		y := top + i*barH
		w := br.value / xmax * plotW
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text><rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/><text x="%.1f" y="%d">%s</text>`+"\n",
			left-8, y+barH/2+4, html.EscapeString(br.label), left, y+3, w, barH-6, br.color, float64(left)+w+4, y+barH/2+4, html.EscapeString(br.text))
	}
	axisY := top + barH*len(bars) + 4
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>`, left, svgW-svgRight, axisY, axisY)
	for _, t := range ticks(0, xmax) {
		x := float64(left) + t/xmax*plotW
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`, x, axisY+16, fmtTick(t))
	}
	fmt.Fprintf(&b, "\n"+`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n</svg>\n", float64(left)+plotW/2, axisY+36, html.EscapeString(xlabel))
	return []byte(b.String())
}

func writeLegend(b *strings.Builder, items [][2]string, y int) {
	x := svgLeft
	for _, it := range items {
		fmt.Fprintf(b, `<rect x="%d" y="%d" width="14" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`, x, y-9, it[0], x+18, y, html.EscapeString(it[1]))
		x += 28 + 7*len([]rune(it[1]))
	}
	b.WriteString("\n")
}

// ticks returns about 6 round values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	if hi <= lo {
		return []float64{lo}
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func fmtTick(t float64) string {
	switch {
	case t == math.Trunc(t) && math.Abs(t) >= 1e6:
		return fmt.Sprintf("%gM", t/1e6)
	case t == math.Trunc(t) && math.Abs(t) >= 1e4:
		return fmt.Sprintf("%gk", t/1e3)
	}
	return fmt.Sprintf("%g", math.Round(t*1000)/1000)
}

// stampedeSVG draws every strategy's recomputes along the measured window.
func stampedeSVG(rep *stampedeReport) []byte {
	var rows []svgRow
	for _, r := range rep.Results {
		row := svgRow{label: r.Strategy, note: fmt.Sprintf("%d recomputes, %d simultaneous, %d misses, p99 %s",
			r.Recomputes, r.Simultaneous, r.Misses, benchload.Dur(r.Latency.P99))}
		for _, ev := range r.Events {
			m := svgMark{x: ev.At.Seconds(), color: "#7f7f7f", title: fmt.Sprintf("%.2fs took %s", ev.At.Seconds(), benchload.Dur(ev.Took))}
			switch {
			case ev.Simul:
				m.color = "#d62728"
			case ev.Daemon:
				m.color = "#2ca02c"
			}
			row.marks = append(row.marks, m)
		}
		rows = append(rows, row)
	}
	title := fmt.Sprintf("Recomputes of one hot key: %d workers, expiry %v, recompute %v, %v per strategy",
		rep.Workers, rep.Expiry, rep.Recompute, rep.Duration)
	return timelineSVG(title, "seconds into the measured window", rep.Duration.Seconds(), rows,
		[][2]string{{"#7f7f7f", "recompute by an app"}, {"#d62728", "simultaneous recompute"}, {"#2ca02c", "daemon refresh"}})
}

// writeResults writes a run's plot (drawn by plot) to svgPath and its report as JSON to jsonPath; an empty path
// skips that file.
func writeResults[R any](svgPath, jsonPath string, rep R, plot func(R) []byte, stderr io.Writer) error {
	if svgPath != "" {
		if err := writeFile(svgPath, plot(rep), stderr); err != nil {
			return err
		}
	}
	if jsonPath != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := writeFile(jsonPath, b, stderr); err != nil {
			return err
		}
	}
	return nil
}
