// Command keepwarm keeps hot Redis keys warm: it rebuilds them from PostgreSQL before they expire, under the
// token lock that applications share, and writes their TTLs with jitter.
//
//	keepwarm run --config config.toml                  run the daemon
//	keepwarm status --config config.toml               show the running daemon's hot keys
//	keepwarm warmup --config config.toml --keyspace track --list black-friday --spread 10m
//	                                                   warm keys now, ahead of a promotion
//	keepwarm validate --config config.toml             check a config and summarise it
//	keepwarm fetch --config config.toml --keyspace track 1 2
//	                                                   show what would be written for ids (writes nothing)
//	keepwarm migrate up|down|status --config config.toml
//	                                                   manage keepwarm's tables in PostgreSQL
//	keepwarm healthcheck [--path /livez|/readyz] [--url URL]
//	                                                   exit 0 if the daemon is alive (container health checks)
//	keepwarm version                                   print the version stamped at build time
//
// Exit codes: 0 success, 1 failure (including an invalid config), 2 usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"text/tabwriter"

	// The IANA zones of CRON_TZ= and timezone = live in the binary: the image (scratch or distroless static) has
	// no /usr/share/zoneinfo. About 450 kB. The deploy package's TestContainerImage checks a zoned schedule in it.
	_ "time/tzdata"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(exitCode(err, os.Stderr))
}

// command is one subcommand; each lives in its own file as cmdX.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"validate", "check a config file and print a summary of each keyspace", cmdValidate},
		{"fetch", "print what the source would write for some ids (writes nothing to Redis)", cmdFetch},
		{"migrate", "apply (up), roll back (down) or list (status) keepwarm's PostgreSQL migrations", cmdMigrate},
		{"run", "run the daemon: keep hot keys warm until SIGTERM", cmdRun},
		{"status", "show the running daemon's hot keys, TTLs and next refreshes", cmdStatus},
		{"warmup", "write a keyspace's keys now, ahead of a promotion (ids, file, list or ids_query)", cmdWarmup},
		{"healthcheck", "exit 0 if the daemon's /livez (or --path /readyz) answers 200 (for container health checks)", cmdHealthcheck},
		{"version", "print keepwarm's version", cmdVersion},
	}
}

// run dispatches args[0] to its subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return &usageError{msg: "no command given", printed: true}
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		usage(stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	usage(stderr)
	return usagef("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: keepwarm <command> [flags]")
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run keepwarm <command> -h for its flags.")
}

// usageError is a command-line mistake: exit code 2.
type usageError struct {
	msg     string
	printed bool // the flag package already printed the message and the flags
}

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// errHelp means -h was given and the help printed: exit code 0.
var errHelp = errors.New("help requested")

// parseFlags parses a subcommand's flags, turning a flag error into a usageError and -h into errHelp. The
// FlagSet must use flag.ContinueOnError; it prints its own message and usage.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return &usageError{msg: err.Error(), printed: true}
	}
	return nil
}

// exitCode prints err (unless already printed) and maps it to the process exit code.
func exitCode(err error, stderr io.Writer) int {
	if err == nil || errors.Is(err, errHelp) {
		return 0
	}
	var ue *usageError
	if errors.As(err, &ue) {
		if !ue.printed {
			fmt.Fprintf(stderr, "keepwarm: %v\n", err)
		}
		return 2
	}
	fmt.Fprintf(stderr, "keepwarm: %v\n", err)
	return 1
}
