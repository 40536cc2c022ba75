package warmer

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Keyspace-notification events the warmer listens to.
var notifyEvents = []string{"expired", "evicted", "del", "set"}

// DefaultNodeCheckInterval is how often the warmer re-reads the Cluster's masters and every node's
// notify-keyspace-events while it listens for keyspace notifications (Config.NodeCheckInterval).
const DefaultNodeCheckInterval = 5 * time.Second

// notifyFlags is the notify-keyspace-events setting the listener needs: E (keyevent channels) plus x (expired),
// e (evicted), g (generic: del) and $ (string: set). A stands for all the classes, x, e, g and $ among them.
const notifyFlags = "Exeg$"

// MissingNotifyFlags returns the flags of notifyFlags ("Exeg$") that the notify-keyspace-events value flags
// lacks, in that order, or "" when it has them all ("A" counts for x, e, g and $). Redis's own setting is a set
// of one-letter classes (https://redis.io/docs/latest/develop/use/keyspace-notifications/).
func MissingNotifyFlags(flags string) string {
	var miss strings.Builder
	for _, f := range notifyFlags {
		if strings.ContainsRune(flags, f) || (f != 'E' && strings.ContainsRune(flags, 'A')) {
			continue
		}
		miss.WriteRune(f)
	}
	return miss.String()
}

// NotificationNode is what the warmer knows of keyspace notifications on one Redis node it listens to: every
// master of a Cluster, or the one server (single or Sentinel mode, where Addr is "").
type NotificationNode struct {
	Addr       string `json:"addr"`
	Subscribed bool   `json:"subscribed"` // the node confirmed the SUBSCRIBE (again after each reconnect)
	// Flags is the node's notify-keyspace-events as last read; Missing the needed flags it lacks (see
	// MissingNotifyFlags). Both are "" when it could not be read; Error says why.
	Flags   string `json:"flags"`
	Missing string `json:"missing"`
	Error   string `json:"error,omitempty"`
}

// on reports whether the node delivers every event the warmer needs.
func (n NotificationNode) on() bool { return n.Subscribed && n.Error == "" && n.Missing == "" }

// NotificationsHealthy reports whether keyspace notifications are on and subscribed on every node the warmer
// listens to (the gauge keepwarm_warmer_notifications_enabled). It is false when Config.Notifications is off,
// before the first check, while a node's flags cannot be read, and while a node lacks a flag.
func (w *Warmer) NotificationsHealthy() bool {
	nodes := w.NotificationNodes()
	if len(nodes) == 0 {
		return false
	}
	for _, n := range nodes {
		if !n.on() {
			return false
		}
	}
	return true
}

// NotificationNodes returns the state of every node the warmer listens to, sorted by address; nil when it does
// not listen.
func (w *Warmer) NotificationNodes() []NotificationNode {
	w.notify.mu.Lock()
	defer w.notify.mu.Unlock()
	out := make([]NotificationNode, 0, len(w.notify.nodes))
	for _, s := range w.notify.nodes {
		out = append(out, s.state)
	}
	slices.SortFunc(out, func(a, b NotificationNode) int { return strings.Compare(a.Addr, b.Addr) })
	return out
}

// notifier keeps one subscription per node that publishes keyevents, re-checks notify-keyspace-events after
// every (re)subscribe and every NodeCheckInterval, and follows the Cluster's masters through failovers and
// resharding. Its zero value is ready; listen fills it.
type notifier struct {
	w       *Warmer // the daemon: its Redis client, config, log, metrics, trust state and keyspaces
	mu      sync.Mutex
	nodes   map[string]*nodeSub
	healthy bool // last value logged and exported
	denied  map[string]bool
}

// nodeSub is the subscription to one node.
type nodeSub struct {
	check  sync.Mutex // one checkFlags at a time (the periodic check and a re-subscribe's), so each change logs once
	addr   string     // state.Addr, readable without the lock
	c      redis.UniversalClient
	cancel context.CancelFunc
	done   chan struct{}
	runID  string           // single or Sentinel mode: the run_id of the server when subscribed ("" if unknown)
	state  NotificationNode // guarded by notifier.mu
}

// failoverClientAddr is the Addr that go-redis gives the options of a Sentinel failover client
// (redis.NewFailoverClient, or NewUniversalClient with MasterName), whose server changes at a failover. Only there
// does the warmer read INFO server (so the least-privilege ACL of single mode needs no +info).
const failoverClientAddr = "FailoverClient"

// serverRunID returns the run_id (INFO server) of the server behind w.rdb, or "" when it cannot be read.
func (n *notifier) serverRunID(ctx context.Context) string {
	info, err := n.w.rdb.Info(ctx, "server").Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "run_id:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// listen subscribes to keyevent notifications for early notice of expiries, deletions, evictions and writes by
// apps, until ctx ends. It needs notify-keyspace-events to include notifyFlags; with Config.AutoNotifyFlags it adds
// the missing ones with CONFIG SET where the ACL allows, and otherwise says in the log which are off. A Redis
// restart resets the setting and a pub/sub reconnect loses events, so it checks again on every (re)subscribe.
// In a Redis Cluster every master publishes only its own keys' events: it subscribes on each master, and every
// NodeCheckInterval re-reads the masters (CLUSTER SLOTS), subscribing to new ones after a failover or a topology
// change and dropping nodes that are no longer masters.
func (n *notifier) listen(ctx context.Context) {
	n.mu.Lock()
	n.nodes = map[string]*nodeSub{}
	n.denied = map[string]bool{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		subs := n.nodes
		n.nodes = map[string]*nodeSub{}
		n.mu.Unlock()
		for _, s := range subs {
			s.cancel()
			<-s.done
		}
		n.w.m.notificationsOn.Set(0)
		n.w.m.notificationNodes.Set(0)
	}()
	every := n.w.cfg.NodeCheckInterval
	if every <= 0 {
		every = DefaultNodeCheckInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		n.syncNodes(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// syncNodes subscribes to nodes that publish keyevents and are not subscribed yet, drops those that no longer do,
// and re-checks every node's flags.
func (n *notifier) syncNodes(ctx context.Context) {
	want := map[string]redis.UniversalClient{}
	if cc, ok := n.w.rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
			mu.Lock()
			want[c.Options().Addr] = c
			mu.Unlock()
			return nil
		})
		if err != nil {
			if ctx.Err() == nil {
				n.w.log.Warn("keyspace notifications: cannot read the cluster's masters; keeping the current subscriptions",
					"error", err)
			}
			return
		}
	} else {
		want[""] = n.w.rdb
	}
	// Behind a Sentinel failover client the server changes at a failover while the address ("") does not; the
	// subscription stays on the old master (now a replica, or still a master for a while, publishing its stale
	// copies' events) until that server drops it. The server's run_id tells: a new one means a new subscription,
	// which go-redis dials at the current master.
	runID := ""
	if c, ok := n.w.rdb.(*redis.Client); ok && c.Options().Addr == failoverClientAddr {
		runID = n.serverRunID(ctx)
	}
	n.mu.Lock()
	var gone []*nodeSub
	failover := false
	for addr, s := range n.nodes {
		if addr == "" && runID != "" && s.runID != "" && s.runID != runID {
			gone = append(gone, s)
			delete(n.nodes, addr)
			n.w.log.Info("keyspace notifications: the server changed (failover); subscribing again and re-reading every hot key",
				"run_id", runID)
			failover = true
			continue
		}
		if _, ok := want[addr]; !ok {
			gone = append(gone, s)
			delete(n.nodes, addr)
			n.w.log.Info("keyspace notifications: node is no longer a master; unsubscribed", "node", addr)
		}
	}
	var added []*nodeSub
	for addr, c := range want {
		if _, ok := n.nodes[addr]; ok {
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		s := &nodeSub{addr: addr, c: c, cancel: cancel, done: make(chan struct{}), state: NotificationNode{Addr: addr}}
		if addr == "" {
			s.runID = runID
		}
		n.nodes[addr] = s
		added = append(added, s)
		go func() {
			defer close(s.done)
			n.subscribe(sctx, s)
		}()
	}
	subs := make([]*nodeSub, 0, len(n.nodes))
	for _, s := range n.nodes {
		subs = append(subs, s)
	}
	n.mu.Unlock()
	for _, s := range gone {
		s.cancel()
		<-s.done
	}
	if failover {
		// Asynchronous replication: the new master may lack the last writes of the old one, with no event for
		// the keys it never had. Each one found missing now is a miss (docs/operations.md).
		n.w.rereadAll("failover", time.Time{})
	}
	if len(added) > 0 && len(want) > 1 {
		addrs := make([]string, 0, len(added))
		for _, s := range added {
			addrs = append(addrs, s.addr)
		}
		n.w.log.Info("keyspace notifications: subscribing on masters", "nodes", strings.Join(addrs, ","), "masters", len(want))
	}
	for _, s := range subs {
		n.checkFlags(ctx, s)
	}
	n.notifyHealth()
}

// subscribe runs one node's subscription until ctx ends. go-redis re-subscribes after a lost connection; each
// confirmation of the first channel marks a (re)subscribe, after which the node's flags are checked again.
func (n *notifier) subscribe(ctx context.Context, s *nodeSub) {
	patterns := make([]string, len(notifyEvents))
	for i, ev := range notifyEvents {
		patterns[i] = "__keyevent@" + strconv.Itoa(n.w.cfg.DB) + "__:" + ev
	}
	ps := s.c.Subscribe(ctx, patterns...)
	defer ps.Close()
	ch := ps.ChannelWithSubscriptions()
	for {
		select {
		case <-ctx.Done():
			return
		case msg, ok := <-ch:
			if !ok {
				return
			}
			switch m := msg.(type) {
			case *redis.Message:
				n.onEvent(m.Channel[strings.LastIndexByte(m.Channel, ':')+1:], m.Payload)
			case *redis.Subscription:
				if m.Kind != "subscribe" || m.Channel != patterns[0] {
					continue
				}
				n.mu.Lock()
				again := s.state.Subscribed
				s.state.Subscribed = true
				n.mu.Unlock()
				if again {
					n.w.trust.bump() // events in between are lost: no key's expiry is known for sure any more
					n.w.log.Info("keyspace notifications: re-subscribed after a lost connection; events in between are lost",
						"node", s.addr)
				}
				n.checkFlags(ctx, s)
				n.notifyHealth()
			}
		}
	}
}

// checkFlags reads the node's notify-keyspace-events and, with AutoNotifyFlags, adds the missing flags. It logs
// each change of the node's state once.
func (n *notifier) checkFlags(ctx context.Context, s *nodeSub) {
	s.check.Lock()
	defer s.check.Unlock()
	n.mu.Lock()
	prev := s.state
	n.mu.Unlock()
	next := prev
	next.Error = ""
	res, err := s.c.ConfigGet(ctx, "notify-keyspace-events").Result()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		next.Flags, next.Missing, next.Error = "", "", err.Error()
	} else {
		next.Flags = res["notify-keyspace-events"]
		next.Missing = MissingNotifyFlags(next.Flags)
	}
	if next.Missing != "" && n.w.cfg.AutoNotifyFlags {
		set := next.Flags + next.Missing
		if err := s.c.ConfigSet(ctx, "notify-keyspace-events", set).Err(); err != nil {
			if ctx.Err() != nil {
				return
			}
			n.mu.Lock()
			first := !n.denied[prev.Addr]
			n.denied[prev.Addr] = true
			n.mu.Unlock()
			if first {
				n.w.log.Warn("keyspace notifications: cannot set notify-keyspace-events (notifications = \"auto\" needs +config|set); PTTL reconciliation alone tracks expiries",
					"node", prev.Addr, "notify_keyspace_events", next.Flags, "missing", next.Missing, "error", err)
			}
		} else {
			n.w.log.Info("keyspace notifications: set notify-keyspace-events (notifications = \"auto\")",
				"node", prev.Addr, "was", next.Flags, "now", set)
			next.Flags, next.Missing = set, ""
		}
	}
	n.mu.Lock()
	if _, ok := n.nodes[prev.Addr]; !ok || n.nodes[prev.Addr] != s {
		n.mu.Unlock()
		return // dropped meanwhile
	}
	next.Subscribed = s.state.Subscribed
	s.state = next
	n.mu.Unlock()
	switch {
	case next.Error != "" && prev.Error != next.Error:
		// Not fatal (reconciliation is the ground truth), but say so: a denied CONFIG GET (an ACL without
		// +config|get) would otherwise hide that notifications may be off.
		n.w.log.Warn("keyspace notifications: cannot read notify-keyspace-events; subscribed anyway, PTTL reconciliation tracks expiries either way",
			"node", next.Addr, "error", next.Error)
	case next.Error == "" && next.Missing != "" && (prev.Missing != next.Missing || prev.Error != ""):
		n.w.log.Warn("keyspace notifications are off in Redis; PTTL reconciliation alone tracks expiries (set notifications = \"auto\", or CONFIG SET notify-keyspace-events "+notifyFlags+")",
			"node", next.Addr, "notify_keyspace_events", next.Flags, "missing", next.Missing)
	}
}

// notifyHealth exports the nodes' state and logs when notifications as a whole turn on or off.
func (n *notifier) notifyHealth() {
	nodes := n.w.NotificationNodes()
	on, subscribed := len(nodes) > 0, 0
	for _, nd := range nodes {
		on = on && nd.on()
		if nd.Subscribed {
			subscribed++
		}
	}
	n.w.m.notificationNodes.Set(float64(subscribed))
	n.mu.Lock()
	changed := n.healthy != on
	n.healthy = on
	n.mu.Unlock()
	n.w.trust.set(on)
	if on {
		n.w.m.notificationsOn.Set(1)
	} else {
		n.w.m.notificationsOn.Set(0)
	}
	if changed && on {
		n.w.log.Info("keyspace notifications are on", "nodes", len(nodes))
	} else if changed {
		n.w.log.Warn("keyspace notifications are off or unconfirmed on some node; PTTL reconciliation alone tracks expiries",
			"nodes", len(nodes), "subscribed", subscribed)
	}
}

// onEvent handles one keyevent notification for key.
func (n *notifier) onEvent(event, key string) {
	for _, k := range *n.w.spaceList.Load() { // published, immutable: no lock on the event path
		if k.onEvent(event, key) {
			return
		}
	}
}

// onEvent reports whether key belongs to this keyspace (its template matches it: immutable, so known at once).
// An event for a cold id (not in the hot set the loop last published) is dropped here; one for a hot id joins the
// keyspace's bounded intake, where events for one id coalesce, and the loop takes them all with one message
// (takeEvents).
func (k *keyspace) onEvent(event, key string) bool {
	m := k.match
	if m == nil {
		return false
	}
	id, ok := m.id(key)
	if !ok {
		return false
	}
	if !k.isHot(id) {
		k.w.m.intake.cold.WithLabelValues(k.name).Inc()
		return true
	}
	send, dropped := k.intake.add(event, id)
	if dropped {
		k.w.m.intake.overflow.WithLabelValues(k.name).Inc()
	}
	if send {
		k.mail.Send(func(k *loopState) { k.takeEvents() })
	}
	return true
}

// event runs, on the loop, n keyevent notifications of one kind for the hot id (n > 1 only for evictions, which
// are counted; the others coalesce: see heardEvents).
func (k *loopState) event(event, id string, n int) {
	h := k.hotSet[id]
	if h == nil || h.persistent {
		return
	}
	if !k.owns(id) {
		// Its owner judges it. Only when it went is kept, for a takeover of the key (noteHandover).
		switch event {
		case "expired", "evicted", "del":
			h.goneHeard, h.goneHeardKind = k.w.now(), event
		case "set":
			h.goneHeard, h.goneHeardKind = time.Time{}, ""
		}
		return
	}
	if h.inflight {
		// The refresh in flight settles the key, but not an event that came during it: a del there is an
		// invalidation whose value the refresh's publish may have preceded, an expired one an expiry to judge.
		// settle reads the key again for it (see settle).
		if event == "expired" || event == "evicted" || event == "del" {
			if event == "evicted" {
				k.w.m.ev.evicted.WithLabelValues(k.name).Add(float64(n))
			}
			if h.pendingGone != "del" { // an invalidation outranks an expiry: the app meant the key gone
				h.pendingGone = event
			}
			if event == "expired" {
				h.expiredHeard = k.w.now()
			}
		}
		return
	}
	now := k.w.now()
	switch event {
	case "set":
		// An app (or the daemon itself, just now) wrote the key: learn the new expiry. The first "set" after
		// the daemon's own write, within ownSetWindow, is taken as that write's own notification, however late
		// it arrives (on a loaded machine it can take seconds).
		if now.Before(h.ownSetUntil) {
			h.ownSetUntil = time.Time{}
			break
		}
		if now.Sub(h.lastRefresh) > time.Second {
			h.ownWrite = false
			h.needPTTL = true
			k.adopt = append(k.adopt, h)
		}
	case "expired", "evicted", "del":
		if event == "evicted" {
			k.w.m.ev.evicted.WithLabelValues(k.name).Add(float64(n))
		}
		if event == "expired" && k.doubtResolved(h, now) {
			return // the replaced value's expiry, counted; the current value is far from its own
		}
		h.ownWrite = false
		if h.missing {
			return
		}
		// The event says the key is gone from the node that published it, which need not be where the key lives
		// now: in a Cluster a MIGRATE (resharding) deletes the key on the source node with a del event while it
		// lives on at its new node, and after a Sentinel failover the old master goes on publishing the expiries
		// of its stale copies until Sentinel demotes it. So read the key's PTTL first (the client follows ASK and
		// MOVED, and goes to the current master) and count it only if it is gone. See learnExpiries.
		h.needPTTL, h.goneEvent = true, event
		if event == "expired" {
			h.expiredHeard = now
		}
		k.adopt = append(k.adopt, h)
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
