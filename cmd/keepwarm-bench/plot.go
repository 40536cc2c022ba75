package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// runPlot redraws a benchmark's SVG from the JSON that its --json flag wrote, so that the plots in docs/ can be
// regenerated without re-running a 30-minute benchmark.
func runPlot(_ context.Context, args []string, _, stderr io.Writer) error {
	fs := flag.NewFlagSet("plot", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kind := fs.String("kind", "", "which benchmark wrote the JSON: stampede, trace (also zipf), scale or peers")
	in := fs.String("json", "", "the JSON results file")
	out := fs.String("svg", "", "the SVG file to write")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *in == "" || *out == "" {
		return usageError{errors.New("--json and --svg are required")}
	}
	b, err := os.ReadFile(*in)
	if err != nil {
		return err
	}
	var svg []byte
	switch *kind {
	case "stampede":
		var r stampedeReport
		if err = json.Unmarshal(b, &r); err == nil {
			svg = stampedeSVG(&r)
		}
	case "trace", "zipf":
		var r replayReport
		if err = json.Unmarshal(b, &r); err == nil {
			svg = replaySVG(&r)
		}
	case "peers":
		var r peersReport
		if err = json.Unmarshal(b, &r); err == nil {
			svg = peersSVG(&r)
		}
	case "scale":
		var r scaleReport
		if err = json.Unmarshal(b, &r); err == nil {
			svg = scaleSVG(&r)
		}
	default:
		return usageError{fmt.Errorf("--kind %q: want stampede, trace, zipf, scale or peers", *kind)}
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", *in, err)
	}
	return writeFile(*out, svg, stderr)
}
