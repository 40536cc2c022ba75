// Package reload tells the daemon when to reload its config: on SIGHUP and when the content of the config file,
// or of a file it names (hot-key lists), changes on disk.
//
// It watches directories, not files: editors and `mv` replace a file by renaming a new one over it, which a
// watch on the old file's inode would miss. It follows symlinks: a Kubernetes ConfigMap volume is
// `config.toml -> ..data/config.toml` with `..data -> ..2026_11_30_v1`, and an update swaps `..data`
// atomically. So it watches each file's own directory and the directory of what the file resolves to, and
// resolves the links again after every event.
//
// Events only start a check; a reload needs the content to have changed (a SHA-256 over every watched file)
// and to have stayed quiet for the quiet period, so that a writer that pauses mid-file does not get its partial
// file applied. An invalid file is reported only if it stays invalid for another quiet period.
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
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultQuiet is how long the watched files must see no event before their content is checked, and how long
// an invalid file must stay unchanged before its error is reported.
const DefaultQuiet = time.Second

// Func applies the config on disk. final is false when a file change is tried for the first time: an error
// then is not to be reported (the writer may not be done), and Run calls again with final true after another
// quiet period if the content has not changed meanwhile. SIGHUP calls are always final.
type Func func(reason string, final bool) error

// Watcher turns SIGHUP and file changes into reload calls.
type Watcher struct {
	fs    *fsnotify.Watcher
	log   *slog.Logger
	quiet time.Duration

	mu      sync.Mutex
	files   []string        // absolute paths as configured (maybe symlinks)
	dirs    map[string]bool // directories watched
	applied [sha256.Size]byte
	gen     int // bumped by Watch, which sets applied itself
}

// Option configures a Watcher.
type Option func(*Watcher)

// WithQuiet sets the quiet period; default DefaultQuiet.
func WithQuiet(d time.Duration) Option { return func(w *Watcher) { w.quiet = d } }

// New returns a Watcher over files (the config file and the files it names), taking their current content as
// applied. Call Watch again with the new set after each reload, since a reload may name other files.
func New(log *slog.Logger, files []string, opts ...Option) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{fs: fw, log: log, quiet: DefaultQuiet, dirs: map[string]bool{}}
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
	w.files = w.files[:0]
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		w.files = append(w.files, abs)
	}
	if err := w.resolveLocked(); err != nil {
		return err
	}
	w.applied = w.hashLocked()
	w.gen++
	return nil
}

// setApplied records h as the applied content, unless Watch (called by the reload) has set it since gen.
func (w *Watcher) setApplied(h [sha256.Size]byte, gen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gen == gen {
		w.applied = h
	}
}

// resolveLocked watches each file's directory and the directories along its symlinks, and stops watching
// directories no longer among them (an old ConfigMap version directory, deleted after the swap).
func (w *Watcher) resolveLocked() error {
	want := map[string]bool{}
	for _, f := range w.files {
		want[filepath.Dir(f)] = true
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
			p = target
		}
		if real, err := filepath.EvalSymlinks(f); err == nil {
			want[filepath.Dir(real)] = true
		}
	}
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
	for _, f := range w.files {
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

// Run calls reload (from Run's goroutine, never concurrently) after SIGHUP, or when the watched files' content
// has changed and then seen no event for the quiet period, until ctx ends. The reason passed is "sighup" or
// "file".
func (w *Watcher) Run(ctx context.Context, reload Func) error {
	defer w.fs.Close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var failed *[sha256.Size]byte // content that failed a first, non-final try
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
			failed = nil
		case ev, ok := <-w.fs.Events:
			if !ok {
				return nil
			}
			w.log.Debug("config watcher: event", "path", ev.Name, "op", ev.Op.String())
			w.mu.Lock()
			err := w.resolveLocked()
			w.mu.Unlock()
			if err != nil {
				w.log.Warn("config watcher: cannot watch a directory", "error", err)
			}
			timer.Reset(w.quiet)
		case err, ok := <-w.fs.Errors:
			if !ok {
				return nil
			}
			w.log.Warn("config watcher", "error", err)
		case <-timer.C:
			w.mu.Lock()
			if err := w.resolveLocked(); err != nil {
				w.log.Warn("config watcher: cannot watch a directory", "error", err)
			}
			h, gen := w.hashLocked(), w.gen
			same := h == w.applied
			w.mu.Unlock()
			if same {
				w.log.Debug("config watcher: files touched but their content is unchanged; not reloading")
				failed = nil
				continue
			}
			final := failed != nil && *failed == h
			if err := reload("file", final); err != nil && !final {
				failed = &h
				timer.Reset(w.quiet) // try again once the writer is surely done
				continue
			}
			failed = nil
			w.setApplied(h, gen)
		}
	}
}
