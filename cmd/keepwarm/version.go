package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"runtime"
)

// cmdVersion is `keepwarm version`: the version stamped at build time (-X main.version), the Go version and the
// platform.
func cmdVersion(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "keepwarm %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
