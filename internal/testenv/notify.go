package testenv

import (
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// NotifyMessage is one datagram received on a fake NOTIFY_SOCKET.
type NotifyMessage struct {
	At   time.Time
	Text string // e.g. "READY=1\nSTATUS=..." or "WATCHDOG=1"
}

// Notify is a NOTIFY_SOCKET of the test's own: a unixgram socket in a temp dir that records every datagram a
// process under test sends, as systemd would receive them with Type=notify.
type Notify struct {
	mu   sync.Mutex
	msgs []NotifyMessage
}

// NotifySocket listens on a new unixgram socket, points NOTIFY_SOCKET at it for the test (t.Setenv, so the
// test must not be parallel), and closes it on cleanup.
func NotifySocket(t testing.TB) *Notify {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("NOTIFY_SOCKET", path)
	n := &Notify{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, NotifyMessage{At: time.Now(), Text: string(buf[:k])})
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close(); <-done })
	return n
}

// Messages returns a copy of the datagrams received so far, in order.
func (n *Notify) Messages() []NotifyMessage {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]NotifyMessage(nil), n.msgs...)
}
