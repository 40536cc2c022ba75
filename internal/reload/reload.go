// Package reload tells the daemon when to reload its config: on SIGHUP and when the content of the config file,
// or of a file it names (hot-key lists), changes on disk.
//
// It watches directories, not files: editors and `mv` replace a file by renaming a new one over it, which a
// watch on the old file's inode would miss. It follows symlinks: a Kubernetes ConfigMap volume is
// `config.toml -> ..data/config.toml` with `..data -> ..2026_11_30_v1`, and an update swaps `..data`
// atomically. So it watches each file's own directory and the directory of what the file resolves to, and
// resolves the links again after every event on a watched name.
//
// The watched names are the files themselves, every name along their symlink chains (each link, its target,
// the file it finally resolves to) and every directory above those names, so that the swap of `..data` counts.
// Events on any other name in a watched directory (a sibling file, the daemon's own log, an editor's swap file,
// the kubelet's `..data_tmp`) are dropped before anything else: they start no check and reset no timer. The
// watcher logs nothing per event, so a log file written into a watched directory cannot feed it.
//
// Events only start a check; a reload needs the content to have changed (a SHA-256 over every watched file)
// and to have stayed quiet for the quiet period (DefaultQuiet), so that a writer that pauses mid-file does not
// get its partial file applied. A writer that never pauses does not starve the reload: the check happens at
// the latest DefaultMaxDelay after the first event of a burst. An invalid file is reported only if it stays
// invalid for another quiet period. A valid change that the Func deems drastic (the daemon: it removes a
// keyspace, a schedule or a hot-key list, which is what a file cut short looks like) is applied only once the
// content has stayed the same for the settle period (DefaultSettle); see ErrSettle.
package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// DefaultQuiet is how long the watched files must see no event before their content is checked, and how
	// long an invalid file must stay unchanged before its error is reported.
	DefaultQuiet = time.Second
	// DefaultMaxDelay is the quiet period's ceiling: the content is checked at the latest this long after the
	// first event of a burst, even if events on the watched files keep coming.
	DefaultMaxDelay = 5 * time.Second
	// DefaultSettle is how long content that the Func answered with ErrSettle must stay the same, counted from
	// the last event on the watched files before it was tried, before the Func is called again with final true.
	DefaultSettle = 5 * time.Second
)

// ErrSettle is returned by a Func, on a call with final false, for content that is valid but drastic (the
// daemon: it removes a keyspace, a schedule or a hot-key list). Run then calls again, final, once the content
// has stayed the same for the settle period (WithSettle), counted from the last event before the first call;
// if the content changes meanwhile, the new content is tried afresh instead and the drastic one is never
// applied. A Func must not return ErrSettle when final is true (Run would take it as a final error).
var ErrSettle = errors.New("reload: waiting for the config to settle")

// Func applies the config on disk. final is false when a file change is tried for the first time: an error
// then is not to be reported (the writer may not be done), and Run calls again with final true after another
// quiet period if the content has not changed meanwhile; ErrSettle asks for that second call after the longer
// settle period instead. SIGHUP calls are always final: an operator asked for the reload.
type Func func(reason string, final bool) error

// Watcher turns SIGHUP and file changes into reload calls.
type Watcher struct {
	fs       *fsnotify.Watcher
	log      *slog.Logger
	quiet    time.Duration
	maxDelay time.Duration
	settle   time.Duration

	// mu guards the fields below: Watch (called by the reload, from Run's goroutine, but also before Run starts)
	// and Run share them.
	mu      sync.Mutex
	files   []string        // absolute paths as configured (maybe symlinks)
	extra   []string        // files a rejected config names (Also), watched until the next Watch
	dirs    map[string]bool // directories watched
	names   map[string]bool // the watched names (see the package doc): events on other names are dropped
	applied [sha256.Size]byte
	gen     int // bumped by Watch, which sets applied itself
}

// Option configures a Watcher.
type Option func(*Watcher)

// WithQuiet sets the quiet period; default DefaultQuiet.
func WithQuiet(d time.Duration) Option { return func(w *Watcher) { w.quiet = d } }

// WithMaxDelay sets the quiet period's ceiling, counted from the first event of a burst; default
// DefaultMaxDelay. A value below the quiet period makes every check happen at the ceiling.
func WithMaxDelay(d time.Duration) Option { return func(w *Watcher) { w.maxDelay = d } }

// WithSettle sets how long content answered with ErrSettle must stay the same before the final call; default
// DefaultSettle.
func WithSettle(d time.Duration) Option { return func(w *Watcher) { w.settle = d } }

// New returns a Watcher over files (the config file and the files it names), taking their current content as
// applied. Call Watch again with the new set after each reload, since a reload may name other files. It returns
// fsnotify's error when inotify is not available, and the errors of adding each directory watch that exists.
func New(log *slog.Logger, files []string, opts ...Option) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{
		fs: fw, log: log, quiet: DefaultQuiet, maxDelay: DefaultMaxDelay, settle: DefaultSettle,
		dirs: map[string]bool{}, names: map[string]bool{},
	}
	for _, o := range opts {
		o(w)
	}
	if err := w.Watch(files); err != nil {
		_ = fw.Close()
		return nil, err
	}
	return w, nil
}

// Watch replaces the set of watched files and takes their current content as applied.
func (w *Watcher) Watch(files []string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	abs, err := absAll(files)
	if err != nil {
		return err
	}
	w.files, w.extra = abs, nil
	if err := w.resolveLocked(); err != nil {
		return err
	}
	w.applied = w.hashLocked()
	w.gen++
	return nil
}

// Also watches files too, until the next Watch, without taking their content as applied: the files that a
// config the Func rejected names (a new hot-key list it refers to before the list exists). Creating or changing
// one of them then starts a check, so the config is applied once it is valid, without waiting for another edit
// or a SIGHUP. It returns the errors of adding directory watches, as Watch does.
func (w *Watcher) Also(files []string) error {
	abs, err := absAll(files)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.extra = abs
	return w.resolveLocked()
}

func absAll(files []string) ([]string, error) {
	out := make([]string, 0, len(files))
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return nil, err
		}
		out = append(out, abs)
	}
	return out, nil
}

// allLocked returns the watched files: Watch's, then Also's.
func (w *Watcher) allLocked() []string { return append(slices.Clip(w.files), w.extra...) }

// setApplied records h as the applied content, unless Watch (called by the reload) has set it since gen.
func (w *Watcher) setApplied(h [sha256.Size]byte, gen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gen == gen {
		w.applied = h
	}
}

// watched reports whether an event on name can change what the watched files read.
func (w *Watcher) watched(name string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.names[filepath.Clean(name)]
}

// resolveLocked recomputes the watched names (see the package doc), watches each file's directory and the
// directories along its symlinks, and stops watching directories no longer among them (an old ConfigMap version
// directory, deleted after the swap).
func (w *Watcher) resolveLocked() error {
	want := map[string]bool{}
	names := map[string]bool{}
	name := func(p string) {
		for p = filepath.Clean(p); !names[p]; p = filepath.Dir(p) {
			names[p] = true // p and every directory above it: renaming any of them changes what p reads
		}
	}
	for _, f := range w.allLocked() {
		want[filepath.Dir(f)] = true
		name(f)
		p := f
		for range 16 { // follow links one step at a time: each link's directory can change
			target, err := os.Readlink(p)
			if err != nil {
				break
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(p), target)
			}
			want[filepath.Dir(target)] = true
			name(target)
			p = target
		}
		if real, err := filepath.EvalSymlinks(f); err == nil {
			want[filepath.Dir(real)] = true
			name(real)
		}
	}
	w.names = names
	var errs []error
	for d := range want {
		if w.dirs[d] {
			continue
		}
		if err := w.fs.Add(d); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			continue
		}
		w.dirs[d] = true
	}
	for d := range w.dirs {
		if !want[d] {
			_ = w.fs.Remove(d) // gone already if it was deleted
			delete(w.dirs, d)
		}
	}
	return errors.Join(errs...)
}

// hashLocked returns a SHA-256 over the files' paths and contents (a missing file hashes as absent).
func (w *Watcher) hashLocked() [sha256.Size]byte {
	h := sha256.New()
	for _, f := range w.allLocked() {
		h.Write([]byte(f))
		b, err := os.ReadFile(f)
		if err != nil {
			h.Write([]byte{0})
			continue
		}
		h.Write([]byte{1})
		h.Write(b)
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// pending is content that a call with final false did not apply.
type pending struct {
	hash    [sha256.Size]byte
	retryAt time.Time // when to call again, final, if the content is still hash
}

// Run calls reload (from Run's goroutine, never concurrently) until ctx ends:
//   - after SIGHUP, at once, with reason "sighup" and final true;
//   - with reason "file" when the watched files' content has changed: once no event on them came for the quiet
//     period, or at the latest the max delay after the first event of a burst; final is true for the second
//     call on the same content after a first call failed (another quiet period later) or returned ErrSettle
//     (once the content stayed the same for the settle period).
//
// Events on names that are not watched are dropped unlogged. Run returns nil when ctx ends or fsnotify closes.
func (w *Watcher) Run(ctx context.Context, reload Func) error {
	defer w.fs.Close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var (
		first, last time.Time // the first and last event on a watched name since the last check; first zero if none
		pend        *pending
	)
	// arm sets the timer for the next check: the end of the burst's quiet period (capped by the max delay) while
	// a burst is on, else the pending content's retry.
	arm := func() {
		var at time.Time
		switch {
		case !first.IsZero():
			at = last.Add(w.quiet)
			if ceiling := first.Add(w.maxDelay); ceiling.Before(at) {
				at = ceiling
			}
		case pend != nil:
			at = pend.retryAt
		default:
			timer.Stop()
			return
		}
		timer.Reset(time.Until(at))
	}
	event := func() {
		now := time.Now()
		if first.IsZero() {
			first = now
		}
		last = now
		w.mu.Lock()
		err := w.resolveLocked()
		w.mu.Unlock()
		if err != nil {
			w.log.Warn("config watcher: cannot watch a directory", "error", err)
		}
		arm()
	}
	check := func() {
		first = time.Time{}
		w.mu.Lock()
		if err := w.resolveLocked(); err != nil {
			w.log.Warn("config watcher: cannot watch a directory", "error", err)
		}
		h, gen := w.hashLocked(), w.gen
		same := h == w.applied
		w.mu.Unlock()
		if same {
			w.log.Debug("config watcher: files touched but their content is unchanged; not reloading")
			pend = nil
			return
		}
		final := false
		if pend != nil && pend.hash == h {
			if time.Now().Before(pend.retryAt) {
				return // still settling; arm waits for retryAt
			}
			final = true
		}
		err := reload("file", final)
		switch {
		case err == nil || final:
			pend = nil
			w.setApplied(h, gen)
		case errors.Is(err, ErrSettle):
			since := last // the last write the content could come from
			if since.IsZero() {
				since = time.Now()
			}
			pend = &pending{hash: h, retryAt: since.Add(w.settle)}
			w.log.Info("config watcher: change waits for the files to settle", "settle", w.settle,
				"until", pend.retryAt.Format(time.RFC3339Nano))
		default:
			pend = &pending{hash: h, retryAt: time.Now().Add(w.quiet)} // try again once the writer is surely done
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			w.mu.Lock()
			h, gen := w.hashLocked(), w.gen
			w.mu.Unlock()
			_ = reload("sighup", true)
			w.setApplied(h, gen)
			pend = nil
			arm()
		case ev, ok := <-w.fs.Events:
			if !ok {
				return nil
			}
			if w.watched(ev.Name) {
				event()
			}
		case err, ok := <-w.fs.Errors:
			if !ok {
				return nil
			}
			w.log.Warn("config watcher", "error", err)
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				event() // events were lost, maybe on a watched file: check
			}
		case <-timer.C:
			check()
			arm()
		}
	}
}
