package warmer

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/keepwarm/keepwarm/lockstep"
)

// Defaults of a FleetConfig: the one definition of each. internal/config refers to these.
const (
	// DefaultHeartbeatInterval is how often a replica renews its heartbeat and re-reads the member list.
	DefaultHeartbeatInterval = 500 * time.Millisecond
	// DefaultHeartbeatTTL is how long a heartbeat lasts: a replica that stops (kill -9) leaves the fleet at most
	// this long after its last heartbeat.
	DefaultHeartbeatTTL = 2 * time.Second
	// DefaultFleetKeyPrefix starts the default fleet key (see DefaultFleetKey).
	DefaultFleetKeyPrefix = "keepwarm:fleet:"
)

// lateBeats is how many heartbeat intervals a member may go without renewing its heartbeat before the others
// cover its keys (see FleetConfig). One and a half: a heartbeat that is merely slow does not trigger it, a
// missed one does.
const lateBeats = 1.5

// FleetConfig makes replicas share the work: each hot key is refreshed by exactly one live replica, its owner,
// chosen by rendezvous (highest-random-weight) hashing of the id over the replicas whose heartbeat is live in
// Redis (Thaler and Ravishankar, "Using name-based mappings to increase hit rates", IEEE/ACM ToN 1998). When a
// replica joins or leaves, only the keys it gains or loses move.
//
// Every replica heartbeats every HeartbeatInterval with one command (fleet.lua): it writes its own expiry
// (Redis's clock + HeartbeatTTL) into the fleet's sorted set Key, removes the members whose expiry has passed,
// and reads the list. A replica that stops cleanly removes itself; one that dies (kill -9) drops out at most
// HeartbeatTTL after its last heartbeat, so its keys move to the others within HeartbeatInterval +
// HeartbeatTTL. Meanwhile, as soon as a member is late (no heartbeat for 1.5 intervals), the replica that will
// inherit each of its keys covers the key already, so that keys close to expiry are refreshed in time. Overlaps
// (a late replica that was only slow, views that differ for one interval) are safe: every refresh still takes
// the token lock and re-checks the TTL under it.
//
// All replicas of one fleet must use the same heartbeat settings and keyspaces; a zero Key turns sharing off
// (this warmer owns every hot key).
type FleetConfig struct {
	// Key is the Redis sorted set of the fleet's members (member: replica id; score: heartbeat expiry in Unix
	// ms). "" turns sharing off. DefaultFleetKey derives one from the keyspaces' key layouts.
	Key string
	// ReplicaID names this replica in the member set; default DefaultReplicaID() (hostname-pid). Two replicas
	// with one id would each think they own the same keys: ids must be unique.
	ReplicaID string
	// HeartbeatInterval is how often the heartbeat is renewed and the member list re-read; default
	// DefaultHeartbeatInterval, at least 10ms.
	HeartbeatInterval time.Duration
	// HeartbeatTTL is how long a heartbeat lasts; default DefaultHeartbeatTTL, at least 2 × HeartbeatInterval.
	HeartbeatTTL time.Duration
}

// LockTokenPrefix starts every token of the daemon's rebuild locks: LockToken(replica) is
// "kw:<replica>:<32 hex digits of lockstep.NewToken>". The token stays unique and unguessable (lockstep compares
// tokens only for equality, docs/protocol.md §2), and a lock read with GET names the replica that holds it: an
// operator can tell a daemon's lease from an app's lock (whose tokens are bare hex), and the soak checks that
// the locks of a killed replica lapse within its lease.
const LockTokenPrefix = "kw:"

// LockToken returns a new token for a rebuild lock of the replica (FleetConfig.ReplicaID, resolved).
func LockToken(replica string) string {
	return LockTokenPrefix + replica + ":" + lockstep.NewToken()
}

// DefaultReplicaID is the replica id of this process: its host name and process id, "host-1234".
func DefaultReplicaID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "keepwarm"
	}
	return host + "-" + strconv.Itoa(os.Getpid())
}

// DefaultFleetKey is the default FleetConfig.Key for replicas running keyspaces with the given cache-key
// templates: DefaultFleetKeyPrefix plus a hash of the sorted templates. Replicas with the same keyspace layouts
// form one fleet; a replica with other keyspaces (or one mid-way through a config rollout) forms its own and
// refreshes all of its hot keys, which the lock keeps safe.
func DefaultFleetKey(templates []string) string {
	s := slices.Clone(templates)
	slices.Sort(s)
	d := xxhash.New()
	for _, t := range s {
		_, _ = d.WriteString(t)
		_, _ = d.WriteString("\x00")
	}
	return DefaultFleetKeyPrefix + strconv.FormatUint(d.Sum64(), 16)
}

// FleetFieldError is one invalid field of a FleetConfig: `fleet: heartbeat_ttl: ...`. Field is the config
// file's key.
type FleetFieldError struct{ Field, Msg string }

func (e *FleetFieldError) Error() string { return "fleet: " + e.Field + ": " + e.Msg }

// Resolve returns c with its defaults filled in, or every invalid field as a *FleetFieldError (joined). A
// zero Key (sharing off) resolves to itself.
func (c FleetConfig) Resolve() (FleetConfig, error) {
	if c.Key == "" {
		return c, nil
	}
	if c.ReplicaID == "" {
		c.ReplicaID = DefaultReplicaID()
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HeartbeatTTL == 0 {
		c.HeartbeatTTL = DefaultHeartbeatTTL
	}
	var errs []error
	if c.HeartbeatInterval < 10*time.Millisecond {
		errs = append(errs, &FleetFieldError{"heartbeat_interval", fmt.Sprintf("%v is below 10ms", c.HeartbeatInterval)})
	}
	if c.HeartbeatTTL < 2*c.HeartbeatInterval {
		errs = append(errs, &FleetFieldError{"heartbeat_ttl", fmt.Sprintf("%v is below 2 × heartbeat_interval (%v): one slow heartbeat would drop the replica",
			c.HeartbeatTTL, c.HeartbeatInterval)})
	}
	if len(c.ReplicaID) > 200 {
		errs = append(errs, &FleetFieldError{"replica_id", "longer than 200 bytes"})
	}
	return c, errors.Join(errs...)
}

//go:embed fleet.lua
var fleetLua string

var fleetScript = redis.NewScript(fleetLua)

// FleetMember is one replica in the fleet's member set, as /debug/fleet shows it.
type FleetMember struct {
	ID string `json:"id"`
	// ExpiresIn is how long its heartbeat has left by Redis's clock, at the last read.
	ExpiresIn time.Duration `json:"expires_in_ns"`
	// Late is true when it missed a heartbeat: the others cover its keys until it is back or gone.
	Late bool `json:"late"`
	Self bool `json:"self"`
}

// FleetStatus is this replica's view of the fleet.
type FleetStatus struct {
	Enabled           bool          `json:"enabled"`
	Key               string        `json:"key,omitempty"`
	ReplicaID         string        `json:"replica_id,omitempty"`
	HeartbeatInterval time.Duration `json:"heartbeat_interval_ns,omitempty"`
	HeartbeatTTL      time.Duration `json:"heartbeat_ttl_ns,omitempty"`
	// Members are the live members at the last successful heartbeat, by id.
	Members []FleetMember `json:"members"`
	// LastHeartbeat is when the last heartbeat succeeded (zero before the first).
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// LastError is the last heartbeat's error, "" when it succeeded.
	LastError string `json:"last_error,omitempty"`
}

// fleetView is one reading of the member list. Owners are the members that take keys: the live ones that are
// not late (all live ones if every other member is late, which leaves this replica alone).
type fleetView struct {
	self string
	at   time.Time // when the heartbeat that read it was sent (local clock)
	// ran is when Redis ran that heartbeat (its TIME). Far after at, Redis did not answer meanwhile: a pause
	// of Redis, not of this process (whose command Redis would have run at once, the reply waiting for it).
	ran     time.Time
	members []FleetMember
	owners  []string // sorted
	hashes  []uint64 // xxhash of each owner's id
	selfIdx int      // index of self in owners
	// joining marks the view of a replica that has not joined yet (joiningView): it owns nothing.
	joining bool
}

// joiningView is the view of a replica before it joins its fleet: it owns no key, so that its keyspaces learn
// the hot set (their first poll) while the members already in the fleet keep refreshing every key. Joining
// before that handed a restarted replica 1/N of the keys before it knew any of them: the others gave them up at
// once, and keys that fell due in between expired, uncounted (a kill -9 soak: gaps of 1.2–1.6 s on keys that no
// daemon logged).
func joiningView(self string) *fleetView {
	return &fleetView{self: self, joining: true, members: []FleetMember{{ID: self, Self: true}}}
}

// soloView is the view of a warmer that shares nothing: it owns every key.
func soloView(self string) *fleetView {
	return &fleetView{self: self, owners: []string{self}, hashes: []uint64{xxhash.Sum64String(self)},
		members: []FleetMember{{ID: self, Self: true}}}
}

// owns reports whether this replica owns id under v: rendezvous hashing, with the id hashed once and mixed
// with each owner's precomputed hash by a xorshift-multiply step (the construction of
// github.com/dgryski/go-rendezvous, which go-redis's Ring uses too). A nil view owns everything.
func (v *fleetView) owns(id string) bool {
	if v != nil && v.joining {
		return false
	}
	if v == nil || len(v.owners) <= 1 {
		return true
	}
	return hrw(id, v.hashes) == v.selfIdx
}

// hrw returns the index of the highest random weight for id among the owners' hashes.
func hrw(id string, hashes []uint64) int {
	kh := xxhash.Sum64String(id)
	best, bi := uint64(0), 0
	for i, nh := range hashes {
		if h := xorshiftMult64(kh ^ nh); i == 0 || h > best {
			best, bi = h, i
		}
	}
	return bi
}

// xorshiftMult64 is Marsaglia's xorshift64* output step (Vigna, "An experimental exploration of Marsaglia's
// xorshift generators, scrambled", 2016): it turns the combined hash into a well-mixed weight.
func xorshiftMult64(x uint64) uint64 {
	x ^= x >> 12
	x ^= x << 25
	x ^= x >> 27
	return x * 2685821657736338717
}

// sameOwners reports whether two views assign every key alike.
func (v *fleetView) sameOwners(o *fleetView) bool {
	if v == nil || o == nil {
		return v == o
	}
	return v.joining == o.joining && slices.Equal(v.owners, o.owners)
}

// fleet is a warmer's membership: its heartbeat loop and the latest view.
type fleet struct {
	cfg FleetConfig
	w   *Warmer

	mu       sync.Mutex
	view     *fleetView
	lastBeat time.Time
	lastErr  string
	failing  bool
	// failSince is when the first heartbeat of the current run of failures was sent (Config.Clock); zero while
	// they succeed. Failures that began while the heartbeat was still valid mean Redis stopped answering this
	// replica while it ran: an outage, not a stall of this process (see outageLocked).
	failSince time.Time
	// beating is when the heartbeat in flight was sent (Config.Clock); zero between heartbeats. One sent while the
	// heartbeat was valid and still unanswered means Redis is not answering: an outage, not a stall.
	beating time.Time

	members      *prometheus.GaugeVec   // state: live, late
	heartbeats   *prometheus.CounterVec // result: ok, error
	changes      prometheus.Counter
	deduplicated prometheus.Counter // misses another replica had claimed (missclaim.go)

	claims   chan miss   // misses waiting for their claim; read by claimMisses only
	claiming atomic.Bool // claimMisses is running
}

func newFleet(w *Warmer, cfg FleetConfig, reg prometheus.Registerer) (*fleet, error) {
	f := &fleet{cfg: cfg, w: w, view: joiningView(cfg.ReplicaID),
		members: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keepwarm_warmer_fleet_members",
			Help: "Replicas in the fleet's member set at the last heartbeat, by state (live: heartbeating; late: missed a heartbeat, its keys are covered by the others).",
		}, []string{"state"}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keepwarm_warmer_fleet_heartbeats_total",
			Help: "Heartbeats of this replica in the fleet's member set, by result (ok, error).",
		}, []string{"result"}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_warmer_fleet_ownership_changes_total",
			Help: "Changes of the set of replicas that own keys, as seen by this replica (joins, leaves, late members).",
		}),
		deduplicated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keepwarm_warmer_fleet_misses_deduplicated_total",
			Help: "SLO misses this replica saw that another replica of the fleet had already counted (its claim in Redis was there first); not counted again in keepwarm_warmer_hot_expired_total.",
		}),
		claims: make(chan miss, 4096),
	}
	if reg == nil {
		return f, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{f.members, f.heartbeats, f.changes, f.deduplicated} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return f, errors.Join(errs...)
}

// beat heartbeats (op "join") or leaves ("leave") and returns the member list read in the same command.
func (f *fleet) beat(ctx context.Context, op string) (*fleetView, error) {
	sent := time.Now()
	res, err := fleetScript.Run(ctx, f.w.rdb, []string{f.cfg.Key}, f.cfg.ReplicaID, f.cfg.HeartbeatTTL.Milliseconds(), op).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet heartbeat %q: %w", f.cfg.Key, err)
	}
	if len(res) != 2 && len(res) != 3 {
		return nil, fmt.Errorf("fleet heartbeat %q: reply has %d elements, want 3", f.cfg.Key, len(res))
	}
	emptied := false // the set was gone before this beat: a flush (or a new fleet)
	if len(res) == 3 {
		if e, ok := res[2].(int64); ok && e == 0 {
			emptied = true
		}
	}
	now, ok := res[0].(int64)
	flat, ok2 := res[1].([]any)
	if !ok || !ok2 || len(flat)%2 != 0 {
		return nil, fmt.Errorf("fleet heartbeat %q: unexpected reply %v", f.cfg.Key, res)
	}
	self := f.cfg.ReplicaID
	v := &fleetView{self: self, at: sent, ran: time.UnixMilli(now)}
	lateBelow := f.cfg.HeartbeatTTL - time.Duration(lateBeats*float64(f.cfg.HeartbeatInterval))
	var late []string
	for i := 0; i < len(flat); i += 2 {
		id, _ := flat[i].(string)
		score, err := strconv.ParseFloat(fmt.Sprint(flat[i+1]), 64)
		if id == "" || err != nil {
			continue
		}
		left := time.Duration(int64(score)-now) * time.Millisecond
		m := FleetMember{ID: id, ExpiresIn: left, Self: id == self, Late: id != self && left < lateBelow}
		v.members = append(v.members, m)
		if m.Late {
			late = append(late, id)
		} else {
			v.owners = append(v.owners, id)
		}
	}
	if emptied && op == "join" {
		// A flush emptied the member set: the other replicas are alive and will be back in it at their next beat.
		// Until their last known heartbeat runs out, keep them, so that ownership does not flap to this replica
		// for every key (and back), each replica counting the flushed keys as its own misses.
		// They are written back to the set too, so that the replicas beating after this one see them as well, each
		// with a full heartbeat TTL, as if it had just beaten (the flush removed its beat; were it dead, it leaves
		// one heartbeat TTL later). A member that was late stays late in this view until it beats again.
		var restore []redis.Z
		if prev := f.current(); prev != nil {
			for _, m := range prev.members {
				left := m.ExpiresIn - sent.Sub(prev.at)
				if m.Self || left <= 0 || slices.ContainsFunc(v.members, func(n FleetMember) bool { return n.ID == m.ID }) {
					continue
				}
				left = f.cfg.HeartbeatTTL // it beat before the flush: it gets one more heartbeat TTL to beat again
				m.ExpiresIn = left
				v.members = append(v.members, m)
				if m.Late {
					late = append(late, m.ID)
				} else {
					v.owners = append(v.owners, m.ID)
				}
				restore = append(restore, redis.Z{Member: m.ID, Score: float64(now + left.Milliseconds())})
			}
		}
		if len(restore) > 0 {
			_ = f.w.rdb.ZAddNX(ctx, f.cfg.Key, restore...).Err() // best effort: each member's next beat re-adds it anyway
		}
	}
	if op == "join" && !slices.ContainsFunc(v.members, func(m FleetMember) bool { return m.Self }) {
		// Cannot happen (the script just added it), but never leave this replica out of its own view.
		v.members = append(v.members, FleetMember{ID: self, ExpiresIn: f.cfg.HeartbeatTTL, Self: true})
		v.owners = append(v.owners, self)
	}
	slices.SortFunc(v.members, func(a, b FleetMember) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	slices.Sort(v.owners)
	v.selfIdx = slices.Index(v.owners, self)
	v.hashes = make([]uint64, len(v.owners))
	for i, id := range v.owners {
		v.hashes[i] = xxhash.Sum64String(id)
	}
	f.members.WithLabelValues("live").Set(float64(len(v.members) - len(late)))
	f.members.WithLabelValues("late").Set(float64(len(late)))
	return v, nil
}

// stale reports whether what this replica knows of its keys' expiries may be stale at now: its heartbeat has
// lapsed (lapsedLocked) because the process itself stalled (a SIGSTOP, a frozen VM), while the others, still
// heartbeating, took its keys over and refreshed them. A lapse that began with failing heartbeats is an outage
// of Redis as this replica saw it (a pause, a restart, a failover): nobody could write while Redis did not
// answer, and what the replica knew is what it must judge its keys by afterwards (the first replica back takes
// every key for a moment; the miss claims, missclaim.go, keep a miss from counting twice). When only this
// replica's link was cut, the others did write: their refreshes before the expiry it knew read as early
// rewrites (their TTL proves it, unless a wide jitter hides it: then one is counted that was no miss), and a
// miss they counted is claimed before this replica's.
func (f *fleet) stale(now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lapsedLocked(now) && !f.outageLocked()
}

// outageLocked reports whether Redis stopped answering this replica while its heartbeat was still valid: the
// current run of heartbeat failures, or the heartbeat still in flight, began before it lapsed.
func (f *fleet) outageLocked() bool {
	if f.lastBeat.IsZero() {
		return false
	}
	failed := f.failing && !f.failSince.IsZero() && f.failSince.Sub(f.lastBeat) <= f.cfg.HeartbeatTTL
	waiting := !f.beating.IsZero() && f.beating.Sub(f.lastBeat) <= f.cfg.HeartbeatTTL
	return failed || waiting
}

// lapsedLocked reports whether this replica's last successful heartbeat is older than HeartbeatTTL at now while
// its last view had other members: they have taken it out of the fleet and own its keys until it beats again. A
// replica alone in its fleet keeps its keys through any lapse: nobody else could have refreshed them.
func (f *fleet) lapsedLocked(now time.Time) bool {
	return !f.lastBeat.IsZero() && now.Sub(f.lastBeat) > f.cfg.HeartbeatTTL && len(f.view.members) > 1
}

// current returns the latest view.
func (f *fleet) current() *fleetView {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view
}

// heartbeatOnce heartbeats and installs the view it read, handing keys over when the owners changed. On error
// the last view stays in force (logged once per outage).
func (f *fleet) heartbeatOnce(ctx context.Context) {
	sent := f.w.now()
	f.mu.Lock()
	f.beating = sent
	f.mu.Unlock()
	v, err := f.beat(ctx, "join")
	f.mu.Lock()
	f.beating = time.Time{}
	if err != nil {
		first := !f.failing
		if first {
			f.failSince = sent
		}
		f.failing, f.lastErr = true, err.Error()
		f.mu.Unlock()
		f.heartbeats.WithLabelValues("error").Inc()
		if first && ctx.Err() == nil {
			f.w.log.Error("fleet heartbeat failing; keeping the last member list", "fleet_key", f.cfg.Key,
				"replica_id", f.cfg.ReplicaID, "error", err)
		}
		return
	}
	recovered := f.failing
	now := f.w.now()
	// A replica whose heartbeat lapsed (it was paused, or cut off from Redis) was taken out of the fleet by the
	// others, which took over its keys meanwhile: what it knew of them is stale, so it re-learns them all.
	// Only a stall makes what it knew stale (stale); after an outage it keeps judging by it. A heartbeat that Redis
	// ran more than a heartbeat TTL after it was sent waited on Redis: an outage too, with no failure to show.
	lapsed := f.lapsedLocked(now) && !f.outageLocked() && v.ran.Sub(v.at) <= f.cfg.HeartbeatTTL
	var lapsedAt time.Time // when the others took this replica's keys over: its last heartbeat's expiry
	if lapsed {
		lapsedAt = f.lastBeat.Add(f.cfg.HeartbeatTTL)
	}
	f.failing, f.lastErr, f.lastBeat, f.failSince = false, "", now, time.Time{}
	old := f.view
	changed := !old.sameOwners(v) || lapsed
	f.view = v
	f.mu.Unlock()
	f.heartbeats.WithLabelValues("ok").Inc()
	if recovered {
		f.w.log.Info("fleet heartbeat recovered", "fleet_key", f.cfg.Key)
	}
	if !changed {
		return
	}
	f.changes.Inc()
	f.w.log.Info("fleet owners changed", "fleet_key", f.cfg.Key, "replica_id", f.cfg.ReplicaID,
		"owners", v.owners, "members", len(v.members))
	spaces := f.w.keyspaces()
	for _, k := range spaces {
		k.setView(v, lapsedAt)
	}
}

// TakeoverBound is how long after a member's last heartbeat the others have taken its keys over at the latest,
// for a fleet whose heartbeat_interval is interval (0: DefaultHeartbeatInterval): the member is late once its
// heartbeat is 1.5 intervals old, which each other replica sees at its next heartbeat, at most one interval
// later; 2.5 intervals in all (docs/operations.md, "Replicas share the work"). The soak uses it to end a killed
// replica's ownership.
func TakeoverBound(interval time.Duration) time.Duration {
	if interval <= 0 {
		interval = DefaultHeartbeatInterval
	}
	return time.Duration((lateBeats + 1) * float64(interval))
}

// takeoverWindow is TakeoverBound for this fleet: how long before this replica takes a late member's keys over
// that member beat last.
func (f *fleet) takeoverWindow() time.Duration { return TakeoverBound(f.cfg.HeartbeatInterval) }

// joinWait bounds how long a starting replica waits for its keyspaces' first polls before it joins its fleet (a
// keyspace whose source check or access-set reads fail would otherwise keep it out for good).
const joinWait = 10 * time.Second

// joinPollEvery is how often a joining replica looks whether a keyspace not polled yet is failing its check.
const joinPollEvery = 20 * time.Millisecond

// join is a starting replica's entry into its fleet: it waits until every keyspace in spaces has polled its
// hot-key signals once (or joinWait, or ctx ends), then heartbeats. Until then the replica owns nothing
// (joiningView) and the others keep every key. If that heartbeat fails, the replica owns every key (soloView)
// until one succeeds: with Redis unreachable nobody else can be refreshing them either.
func (f *fleet) join(ctx context.Context, spaces []*keyspace) {
	if !f.awaitPolls(ctx, spaces) {
		return
	}
	f.heartbeatOnce(ctx)
	f.mu.Lock()
	joining := f.view.joining
	if joining {
		f.view = soloView(f.cfg.ReplicaID)
	}
	v := f.view
	f.mu.Unlock()
	if joining {
		for _, k := range spaces {
			k.setView(v, time.Time{})
		}
	}
}

// awaitPolls waits until every keyspace in spaces has polled once or is failing its source check (its keys
// are not refreshed until it passes, by this replica or any other, so it holds nothing up), or joinWait has
// passed (logged; true either way), or ctx ends (false).
func (f *fleet) awaitPolls(ctx context.Context, spaces []*keyspace) bool {
	deadline := time.NewTimer(joinWait)
	defer deadline.Stop()
	tick := time.NewTicker(joinPollEvery)
	defer tick.Stop()
	for _, k := range spaces {
	wait:
		for {
			select {
			case <-k.polled:
				break wait
			case <-tick.C:
				if _, failing := f.w.checkFailure(k); failing {
					break wait
				}
			case <-deadline.C:
				f.w.log.Warn("fleet: joining before every keyspace has read its hot keys", "keyspace", k.name,
					"waited", joinWait)
				return true
			case <-ctx.Done():
				return false
			}
		}
	}
	return true
}

// run heartbeats every interval until ctx ends, then leaves the fleet so that the others take over at once.
func (f *fleet) run(ctx context.Context) {
	t := time.NewTicker(f.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.HeartbeatInterval)
			defer cancel()
			if _, err := f.beat(lctx, "leave"); err != nil {
				f.w.log.Warn("fleet: could not leave; the others take over when the heartbeat expires",
					"fleet_key", f.cfg.Key, "heartbeat_ttl", f.cfg.HeartbeatTTL, "error", err)
			}
			return
		case <-t.C:
			f.heartbeatOnce(ctx)
		}
	}
}

// status returns the fleet as this replica sees it.
func (f *fleet) status() FleetStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FleetStatus{Enabled: true, Key: f.cfg.Key, ReplicaID: f.cfg.ReplicaID,
		HeartbeatInterval: f.cfg.HeartbeatInterval, HeartbeatTTL: f.cfg.HeartbeatTTL,
		Members: slices.Clone(f.view.members), LastHeartbeat: f.lastBeat, LastError: f.lastErr}
}

// Fleet returns this replica's view of the fleet; Enabled is false when sharing is off.
func (w *Warmer) Fleet() FleetStatus {
	if w.fleet == nil {
		return FleetStatus{Members: []FleetMember{}}
	}
	return w.fleet.status()
}

// owns is the ownership predicate: whether this replica refreshes id. The scheduler asks it where it
// adopts keys (learns their expiry), reconciles them, queues them and dispatches them.
func (k *loopState) owns(id string) bool { return k.view.owns(id) }

// setView installs a new member list: keys this replica no longer owns leave its due queue (a batch in flight
// finishes); keys it gained are adopted (their expiry is read with PTTL, then they are queued). A gained key
// found missing then counts as an SLO miss, since its previous owner may have let it expire. With a non-zero
// lapsedAt (this replica stalled and its heartbeat lapsed then, so the others owned its keys since), every key it
// owns is adopted so, except those whose known expiry came before lapsedAt: nobody else could refresh them
// before they expired, so they are judged against that expiry (a miss this replica still owned; the heirs' claims
// keep it from counting twice).
func (k *keyspace) setView(v *fleetView, lapsedAt time.Time) {
	k.mail.Send(func(k *loopState) { k.applyView(v, lapsedAt) })
}

// applyView is setView's message, on the loop.
func (k *loopState) applyView(v *fleetView, lapsedAt time.Time) {
	lapsed := !lapsedAt.IsZero()
	k.view = v
	now := k.w.now()
	for _, h := range k.hotSet {
		own := v.owns(h.id)
		switch {
		case !own:
			h.ownedSince = time.Time{}
		case h.ownedSince.IsZero() || lapsed:
			h.ownedSince = now
		}
		expiredOwned := lapsed && !h.expiry.IsZero() && h.expiry.Add(expiryTolerance).Before(lapsedAt)
		switch {
		case !own && h.idx >= 0:
			k.q.remove(h)
		case own && lapsed && expiredOwned && !h.persistent:
			if !h.inflight { // in flight, its re-check or publish judges it
				h.needPTTL = true
				k.adopt = append(k.adopt, h)
			}
		case own && (h.idx < 0 || lapsed) && !h.inflight && !h.persistent:
			// What this replica knew of the key dates from before another replica owned it: the first reading
			// judges it afresh (noteHandover), never against that stale expiry (judgeReading would
			// count the other owner's refreshes as rebuilds after an expiry).
			h.needPTTL, h.handover = true, true
			h.expiry, h.counted = time.Time{}, false
			if h.idx < 0 {
				h.takenOverAt = now
			}
			k.adopt = append(k.adopt, h)
		case own && lapsed && h.inflight && !h.persistent:
			// A batch that was in flight through the stall (its PTTL re-check or publish still to come) must not
			// judge the heirs' refreshes against the expiry known before it either: the soak's paused daemon
			// counted 26 misses the observer never saw, all from batches it had sent before the SIGSTOP or at
			// once after the SIGCONT. Its result is judged as a handover's first reading.
			h.handover = true
			h.expiry, h.counted = time.Time{}, false
		}
	}
	k.gauges()
}

// gatherWindow is how far ahead a batch gathers due keys: GatherWindow times the number of owners, so
// that each of n replicas, refreshing 1/n of the keys, still sends batches as large as one replica would, and
// the fleet's origin queries stay those of one daemon.
func (k *loopState) gatherWindow() time.Duration {
	n := 1
	if k.view != nil {
		n = max(1, len(k.view.owners))
	}
	return k.cfg.GatherWindow * time.Duration(n)
}

// owned counts the hot keys this replica owns.
func (k *loopState) owned() int {
	if k.view != nil && k.view.joining {
		return 0
	}
	if k.view == nil || len(k.view.owners) <= 1 {
		return len(k.hotSet)
	}
	if m := k.ownedMemo; m.view == k.view {
		return m.n
	}
	n := 0
	for id := range k.hotSet {
		if k.view.owns(id) {
			n++
		}
	}
	k.ownedMemo = ownedMemo{view: k.view, n: n}
	return n
}

// ownedMemo is owned's last count and the view it was taken under; setHot clears it when the hot set changes,
// and a new view (applyView) makes it stale. Counting re-hashes every hot key, and the gauges ask on every poll:
// 15% of a replica's CPU at 1,000,000 hot keys (docs/benchmarks.md §14).
type ownedMemo struct {
	view *fleetView
	n    int
}

// noteHandover checks the first PTTL reading of a key adopted from another replica: missing means its
// previous owner (dead, or late) let it expire, which is counted as an SLO miss (this replica never knew the key's
// expiry, so noteGone alone would not count it). A key hot for less than one TTL is not counted: its
// previous owner may not have written it yet; unless Redis announced it expired or evicted since that owner's
// last heartbeat, which proves it was. Nor is a key that Redis announced gone (goneHeard) before the
// previous owner's last heartbeat, which came at most takeoverWindow before this replica took the key over: the
// owner was alive then and neither rebuilt nor counted it, so the key was not in its hot set (each replica ranks
// its own, and at the top_n edge they differ) and was no hot key of its owner when it went missing. A kill -9 soak
// counted 8 such keys at one takeover, gone for 1.5 to 10.9 s, and failed its phantom check. Otherwise this is
// conservative: a key that an app deleted, or that the origin lacks, at that moment (or one whose going was not
// announced: notifications off) is counted too.
func (k *loopState) noteHandover(h *hotState, pttl time.Duration, now time.Time) {
	if !h.handover {
		return
	}
	h.handover = false
	goneHeard, goneKind, takenOverAt := h.goneHeard, h.goneHeardKind, h.takenOverAt
	h.goneHeard, h.goneHeardKind, h.takenOverAt = time.Time{}, "", time.Time{} // this reading judges the takeover: what is heard from now on is the owner's
	if pttl != pttlGone || h.missing || h.counted {
		return
	}
	if !goneHeard.IsZero() && !takenOverAt.IsZero() && goneHeard.Before(takenOverAt.Add(-k.w.fleet.takeoverWindow())) {
		return
	}
	// Redis announced it expired (or evicted) since its previous owner's last heartbeat: it had a value, so it was
	// written, however recently it turned hot. Seed 5004 beside stress-ng: track:3094, hot 5.8 s, expired 7 ms
	// before its heir gained it from an owner that stalled and was killed, missing 363 ms, counted by nobody.
	announced := !goneHeard.IsZero() && (goneKind == "expired" || goneKind == "evicted")
	if now.Sub(h.hotSince) < k.cfg.TTL && !announced {
		return
	}
	if at := k.w.lastFlush.Load(); at != 0 && now.Sub(time.Unix(0, at)) < 2*k.w.fleet.cfg.HeartbeatTTL {
		return // gone in a flush just now: its owner at the flush counted it (rereadAll); the views are settling
	}
	k.countMiss(h, now, "taken over from another replica, which had let it expire")
}
