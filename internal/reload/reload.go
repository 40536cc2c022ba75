// Package reload tells the daemon when to reload its config: on SIGHUP and when the config file, or a file it
// names (hot-key lists), changes on disk.
//
// It watches directories, not files: editors and `mv` replace a file by renaming a new one over it, which a
// watch on the old file's inode would miss. Bursts of events (an editor writes a temp file, renames it, touches
// it) are coalesced into one reload after a short quiet period.
package reload

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// DefaultDebounce is the quiet period after the last file event before a reload fires.
const DefaultDebounce = 200 * time.Millisecond

// Watcher turns SIGHUP and file changes into reload calls.
type Watcher struct {
	fs       *fsnotify.Watcher
	log      *slog.Logger
	debounce time.Duration

	mu    sync.Mutex
	files map[string]bool // absolute paths whose changes trigger a reload
	dirs  map[string]bool
}

// New returns a Watcher over files (the config file and the files it names). Call Watch again with the new set
// after each reload, since a reload may name other files.
func New(log *slog.Logger, files []string) (*Watcher, error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	w := &Watcher{fs: fw, log: log, debounce: DefaultDebounce, files: map[string]bool{}, dirs: map[string]bool{}}
	if err := w.Watch(files); err != nil {
		_ = fw.Close()
		return nil, err
	}
	return w, nil
}

// Watch replaces the set of watched files. Directories already watched stay watched.
func (w *Watcher) Watch(files []string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.files = make(map[string]bool, len(files))
	for _, f := range files {
		abs, err := filepath.Abs(f)
		if err != nil {
			return err
		}
		w.files[abs] = true
		dir := filepath.Dir(abs)
		if w.dirs[dir] {
			continue
		}
		if err := w.fs.Add(dir); err != nil {
			return err
		}
		w.dirs[dir] = true
	}
	return nil
}

// Run calls reload (from Run's goroutine, never concurrently) after SIGHUP or a change to a watched file,
// until ctx ends. The reason passed is "sighup" or "file".
func (w *Watcher) Run(ctx context.Context, reload func(reason string)) error {
	defer w.fs.Close()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			reload("sighup")
		case ev, ok := <-w.fs.Events:
			if !ok {
				return nil
			}
			abs, _ := filepath.Abs(ev.Name)
			w.mu.Lock()
			relevant := w.files[abs]
			w.mu.Unlock()
			if relevant && ev.Op&(fsnotify.Write|fsnotify.Create|fsnotify.Rename|fsnotify.Remove) != 0 {
				timer.Reset(w.debounce)
			}
		case err, ok := <-w.fs.Errors:
			if !ok {
				return nil
			}
			w.log.Warn("config watcher", "error", err)
		case <-timer.C:
			reload("file")
		}
	}
}
