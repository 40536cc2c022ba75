package warmer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/migrations"
	"github.com/keepwarm/keepwarm/warmer"
)

func TestParseCron(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec    string
		wantErr string // "" means valid
	}{
		{"0 3 * * *", ""},
		{"*/2 * * * * *", ""},
		{"@every 10m", ""},
		{"CRON_TZ=Europe/Berlin 30 2 * * *", ""},
		{"0 0 29 2 *", ""}, // fires every four years
		{"TZ=UTC", "no schedule fields"},
		{"CRON_TZ=Europe/Berlin", "no schedule fields"},
		{"TZ=Nowhere/Town 0 3 * * *", "Nowhere/Town"},
		{"0 0 30 2 *", "never fires"},
		{"0 0 31 4 *", "never fires"},
		{"61 * * * *", "61"},
		{"", "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			s, err := warmer.ParseCron(tt.spec)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("ParseCron(%q): %v", tt.spec, err)
			case tt.wantErr == "" && s.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero():
				t.Errorf("ParseCron(%q): no next activation", tt.spec)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("ParseCron(%q) = %v, want an error containing %q", tt.spec, s, tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Errorf("ParseCron(%q): got %q, want it to contain %q", tt.spec, err, tt.wantErr)
			}
		})
	}
}

// recorder is a RunRecorder that counts runs and tells when one finishes.
type recorder struct {
	mu       sync.Mutex
	started  int
	finished int
	done     chan struct{} // one send per finished run, if not nil
}

func (r *recorder) Start(context.Context, string, string, string) (int64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started++
	return int64(r.started), nil
}

func (r *recorder) Finish(context.Context, int64, warmer.WarmupResult, error) error {
	r.mu.Lock()
	r.finished++
	r.mu.Unlock()
	if r.done != nil {
		r.done <- struct{}{}
	}
	return nil
}

func (r *recorder) counts() (started, finished int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started, r.finished
}

// runs sums keepwarm_schedule_runs_total by result.
func scheduleRuns(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "keepwarm_schedule_runs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// cronDaemon is one replica's Cron under a fake clock, with its own Redis client, warmer and registry.
type cronDaemon struct {
	c     *warmer.Cron
	reg   *prometheus.Registry
	rec   *recorder
	logs  *testenv.LogBuffer
	fired chan string // the result of each firing the Cron counted, shared by the daemons of a test
}

// newCronDaemons builds n daemons whose warmers (and so Crons) read clk; rec, if not nil, gives daemon i's
// RunRecorder (else a *recorder).
func newCronDaemons(t *testing.T, f *fixture, clk clockwork.Clock, n int, rec func(i int) warmer.RunRecorder,
	scheds ...warmer.ScheduleConfig) []*cronDaemon {
	t.Helper()
	cfg := f.config()
	cfg.TTL, cfg.RefreshAhead = time.Minute, 10*time.Second // the written keys outlive the test
	fired := make(chan string, 256)
	var out []*cronDaemon
	for i := 0; i < n; i++ {
		w, err := warmer.New(testenv.Redis(t), warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		d := &cronDaemon{reg: prometheus.NewRegistry(), rec: &recorder{}, logs: &testenv.LogBuffer{}, fired: fired}
		log := slog.New(slog.NewTextHandler(d.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		var r warmer.RunRecorder = d.rec
		if rec != nil {
			r = rec(i)
		}
		if d.c, err = warmer.NewCron(w, r, d.reg, log); err != nil {
			t.Fatal(err)
		}
		warmer.SetCronFired(d.c, func(_, result string) { fired <- result })
		if err := d.c.Update(scheds); err != nil {
			t.Fatal(err)
		}
		out = append(out, d)
	}
	return out
}

// runCrons runs every daemon's Cron until the returned stop is called (or the test ends); stop waits for them.
func runCrons(t *testing.T, ds []*cronDaemon) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.c.Run(ctx); err != nil {
				t.Errorf("Cron.Run: %v", err)
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// advance moves clk forward in steps, each time after every Cron loop is waiting on its timer, until it
// reaches until.
func advance(t *testing.T, clk *clockwork.FakeClock, loops int, step time.Duration, until time.Time) {
	t.Helper()
	for clk.Now().Before(until) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := clk.BlockUntilContext(ctx, loops)
		cancel()
		if err != nil {
			t.Fatalf("at %v: the cron loops are not waiting on the clock: %v", clk.Now(), err)
		}
		clk.Advance(min(step, until.Sub(clk.Now())))
	}
}

// fire moves clk to each instant of at in turn and waits, after each, until the daemons have counted
// perInstant more firings (of any result): the runs of one instant end before the next instant comes.
func fire(t *testing.T, clk *clockwork.FakeClock, ds []*cronDaemon, perInstant int, at ...time.Time) {
	t.Helper()
	for _, a := range at {
		advance(t, clk, len(ds), a.Sub(clk.Now()), a)
		for i := 0; i < perInstant; i++ {
			waitFired(t, ds[0].fired, "", fmt.Sprintf("firing %d of %d at %v", i+1, perInstant, a))
		}
	}
}

// waitFired waits for the next firing counted on fired, and fails the test after 20 s. With want set, it
// waits for a firing with that result, passing over others.
func waitFired(t *testing.T, fired <-chan string, want, what string) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case got := <-fired:
			if want == "" || got == want {
				return
			}
		case <-deadline.C:
			t.Fatalf("no %s counted within 20 s", what)
		}
	}
}

// TestCronDSTFallBackRunsOnce runs "30 2 * * *" in Europe/Berlin on two daemons whose clock is in UTC (as a
// host in UTC reads it) over the 2025-10-26 fall-back night, when 02:30 happens twice. Each Cron fires at both
// instants, as robfig/cron's schedule does, and the claim key built from the Berlin wall-clock time lets one
// run happen per day across both daemons.
func TestCronDSTFallBackRunsOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	clk := clockwork.NewFakeClockAt(time.Date(2025, 10, 25, 12, 0, 0, 0, time.UTC))
	sched := warmer.ScheduleConfig{Name: f.prefix + "berlin", Spec: "CRON_TZ=Europe/Berlin 30 2 * * *",
		Keyspace: "items", IDs: warmer.SliceIDs([]string{"1", "2"})}
	ds := newCronDaemons(t, f, clk, 2, nil, sched)
	stop := runCrons(t, ds)
	// 2025-10-26 02:30 CEST = 00:30 UTC, 02:30 CET = 01:30 UTC; 2025-10-27 02:30 CET = 01:30 UTC.
	fire(t, clk, ds, 2, time.Date(2025, 10, 26, 0, 30, 0, 0, time.UTC), time.Date(2025, 10, 26, 1, 30, 0, 0, time.UTC),
		time.Date(2025, 10, 27, 1, 30, 0, 0, time.UTC))
	advance(t, clk, len(ds), time.Hour, time.Date(2025, 10, 27, 12, 0, 0, 0, time.UTC))

	stop()
	ok, started := 0.0, 0
	for _, d := range ds {
		ok += scheduleRuns(t, d.reg)["ok"]
		s, _ := d.rec.counts()
		started += s
	}
	if ok != 2 || started != 2 {
		t.Errorf("over two days with a repeated 02:30: %v ok runs, %d recorded, want 2 (one per local day); results %v and %v",
			ok, started, scheduleRuns(t, ds[0].reg), scheduleRuns(t, ds[1].reg))
	}
}

// TestCronDSTSpringForward runs "30 2 * * *" in Europe/Berlin over 2026-03-29, when 02:00–03:00 does not
// exist. With SkipDSTGap the run is skipped, logged and counted; by default it runs at 03:00 (cronie's way),
// claiming the 02:30 wall-clock time.
func TestCronDSTSpringForward(t *testing.T) {
	t.Parallel()
	for _, runSkipped := range []bool{false, true} {
		name := map[bool]string{false: "SkipDSTGap skips and logs", true: "default runs after the gap"}[runSkipped]
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, 3)
			clk := clockwork.NewFakeClockAt(time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC))
			sched := warmer.ScheduleConfig{Name: f.prefix + "spring", Spec: "CRON_TZ=Europe/Berlin 30 2 * * *",
				Keyspace: "items", IDs: warmer.SliceIDs([]string{"1"}), SkipDSTGap: !runSkipped}
			ds := newCronDaemons(t, f, clk, 1, nil, sched)
			stop := runCrons(t, ds)
			// 2026-03-29: no 02:30, the gap ends at 03:00 CEST = 01:00 UTC; 2026-03-30 02:30 CEST = 00:30 UTC.
			fire(t, clk, ds, 1, time.Date(2026, 3, 29, 1, 0, 0, 0, time.UTC), time.Date(2026, 3, 30, 0, 30, 0, 0, time.UTC))
			advance(t, clk, 1, time.Hour, time.Date(2026, 3, 30, 12, 0, 0, 0, time.UTC))
			stop()
			got := scheduleRuns(t, ds[0].reg)
			skippedKey := warmer.ClaimKey(sched.Name, time.Date(2026, 3, 29, 2, 30, 0, 0, time.UTC))
			claimed := f.rdb.Exists(context.Background(), skippedKey).Val() == 1
			logs := ds[0].logs.String()
			if runSkipped {
				if got["ok"] != 2 || got["skipped_dst"] != 0 || !claimed {
					t.Errorf("results %v, 02:30 claimed %v: want 2 ok runs, the first one claiming 2026-03-29 02:30", got, claimed)
				}
				if !strings.Contains(logs, "running it now, right after the gap") || !strings.Contains(logs, "skipped_local_time=\"2026-03-29 02:30:00\"") {
					t.Errorf("no WARN saying the skipped 02:30 run ran after the gap:\n%s", logs)
				}
				return
			}
			if got["ok"] != 1 || got["skipped_dst"] != 1 || claimed {
				t.Errorf("results %v, 02:30 claimed %v: want 1 ok and 1 skipped_dst, nothing claimed for 02:30", got, claimed)
			}
			if !strings.Contains(logs, "daylight-saving change skipped") || !strings.Contains(logs, "skipped_local_time=\"2026-03-29 02:30:00\"") {
				t.Errorf("no WARN naming the skipped local time in the log:\n%s", logs)
			}
		})
	}
}

// TestCronRunsOncePerTimeAcrossDaemons runs one schedule on two daemons (separate Redis clients and warmers)
// and checks through keepwarm.warmup_runs that each scheduled time ran once.
func TestCronRunsOncePerTimeAcrossDaemons(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	pool := testenv.Postgres(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(context.Background(), db, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	name := f.prefix + "every2s"
	t.Cleanup(func() {
		pool.Exec(context.Background(), "delete from keepwarm.warmup_runs where name = $1", name)
	})
	sched := warmer.ScheduleConfig{Name: name, Spec: "*/2 * * * * *", Keyspace: "items",
		IDs: warmer.SliceIDs([]string{"1", "2", "3"})}
	start := time.Date(2026, 5, 4, 10, 0, 0, 500e6, time.UTC)
	clk := clockwork.NewFakeClockAt(start)
	ds := newCronDaemons(t, f, clk, 2, func(i int) warmer.RunRecorder {
		return runs.New(pool, "daemon-"+string(rune('a'+i)))
	}, sched)
	stop := runCrons(t, ds)
	at := start.Truncate(time.Second)
	fire(t, clk, ds, 2, at.Add(2*time.Second), at.Add(4*time.Second), at.Add(6*time.Second)) // three scheduled times
	advance(t, clk, len(ds), time.Second, start.Add(6*time.Second))
	stop()
	var n, hosts int
	var written int64
	err := pool.QueryRow(context.Background(), `select count(*), count(distinct host), coalesce(sum(written), 0)
		from keepwarm.warmup_runs where name = $1 and status = 'ok'`, name).Scan(&n, &hosts, &written)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("%d ok runs of */2 over 6 s on two daemons, want 3 (one per scheduled time)", n)
	}
	if written != int64(3*n) {
		t.Errorf("written %d keys over %d runs, want %d", written, n, 3*n)
	}
	if v := f.rdb.Exists(context.Background(), f.key("1"), f.key("2"), f.key("3")).Val(); v != 3 {
		t.Errorf("%d of 3 keys written", v)
	}
	st, err := ds[0].c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := at.Add(8 * time.Second); len(st) != 1 || !st[0].Next.Equal(want) {
		t.Errorf("status = %+v, want one schedule whose next run is at %v", st, want)
	}
}

func TestCronRejectsBadSchedules(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	w := newWarmer(t, f, f.config())
	c, err := warmer.NewCron(w, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := warmer.SliceIDs([]string{"1"})
	for _, tt := range []struct {
		name string
		s    warmer.ScheduleConfig
		want string
	}{
		{"bad spec", warmer.ScheduleConfig{Name: "x", Spec: "61 * * * *", Keyspace: "items", IDs: ids}, `schedule "x": cron:`},
		{"zone without fields", warmer.ScheduleConfig{Name: "x", Spec: "TZ=UTC", Keyspace: "items", IDs: ids}, "no schedule fields"},
		{"never fires", warmer.ScheduleConfig{Name: "x", Spec: "0 0 30 2 *", Keyspace: "items", IDs: ids}, "never fires"},
		{"unknown keyspace", warmer.ScheduleConfig{Name: "x", Spec: "@daily", Keyspace: "nope", IDs: ids}, "not configured"},
		{"no ids", warmer.ScheduleConfig{Name: "x", Spec: "@daily", Keyspace: "items"}, "ids: none"},
		{"spread above the bound", warmer.ScheduleConfig{Name: "x", Spec: "@daily", Keyspace: "items", IDs: ids,
			Spread: warmer.MaxDuration + 1}, `schedule "x": spread:`},
	} {
		err := c.Update([]warmer.ScheduleConfig{tt.s})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: got %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
}

// TestCronReloadNeverDuplicatesARun reloads a schedule with a new spec while its run is in progress (held in
// the origin query): the new entry fires while it runs and must not start a second run beside it.
func TestCronReloadNeverDuplicatesARun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	entered, release := make(chan struct{}, 8), make(chan struct{})
	f.src.before = func([]string) {
		entered <- struct{}{}
		<-release
	}
	start := time.Date(2026, 5, 4, 10, 0, 0, 500e6, time.UTC)
	clk := clockwork.NewFakeClockAt(start)
	name := f.prefix + "slow"
	sched := warmer.ScheduleConfig{Name: name, Spec: "* * * * * *", Keyspace: "items", IDs: warmer.SliceIDs([]string{"1"})}
	ds := newCronDaemons(t, f, clk, 1, nil, sched)
	d := ds[0]
	d.rec.done = make(chan struct{}, 8)
	stop := runCrons(t, ds)
	advance(t, clk, 1, time.Second, start.Add(time.Second))
	<-entered                    // the first run is under way, held in its query
	sched.Spec = "*/1 * * * * *" // same times, new spec: a new entry
	if err := d.c.Update([]warmer.ScheduleConfig{sched}); err != nil {
		t.Fatal(err)
	}
	advance(t, clk, 1, time.Second, start.Add(3*time.Second))
	waitFired(t, d.fired, "skipped_running", "firing skipped while the run is in progress")
	close(release)
	<-d.rec.done
	stop()
	if started, _ := d.rec.counts(); started != 1 {
		t.Errorf("%d runs started while the first was in progress, want 1", started)
	}
}

// TestCronReloadDeletesRemovedSchedulesSeries removes a schedule that has run: its metric series go away, as a
// removed keyspace's do.
func TestCronReloadDeletesRemovedSchedulesSeries(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	start := time.Date(2026, 5, 4, 10, 0, 0, 500e6, time.UTC)
	clk := clockwork.NewFakeClockAt(start)
	gone := warmer.ScheduleConfig{Name: "gone", Spec: "* * * * * *", Keyspace: "items", IDs: warmer.SliceIDs([]string{"1"})}
	kept := warmer.ScheduleConfig{Name: "kept", Spec: "@daily", Keyspace: "items", IDs: warmer.SliceIDs([]string{"2"})}
	// Claims are fleet-wide: give this test's schedules unique names.
	gone.Name, kept.Name = f.prefix+gone.Name, f.prefix+kept.Name
	ds := newCronDaemons(t, f, clk, 1, nil, gone, kept)
	d := ds[0]
	runCrons(t, ds)
	fire(t, clk, ds, 1, start.Truncate(time.Second).Add(time.Second))
	if got := scheduleRuns(t, d.reg); got["ok"] != 1 {
		t.Fatalf("results %v, want one ok run", got)
	}
	series := func(name string) int {
		mfs, err := d.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "schedule" && l.GetValue() == name {
						n++
					}
				}
			}
		}
		return n
	}
	if n := series(gone.Name); n != 3 {
		t.Fatalf("%d series for the schedule that ran, want 3 (runs, last run, keys written)", n)
	}
	if err := d.c.Update([]warmer.ScheduleConfig{kept}); err != nil {
		t.Fatal(err)
	}
	if n := series(gone.Name); n != 0 { // Update returns once the schedules are replaced
		t.Errorf("%d series for the removed schedule after Update returned, want 0", n)
	}
	st, err := d.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 1 || st[0].Name != kept.Name {
		t.Errorf("status after the reload = %+v, want only %q", st, kept.Name)
	}
}

// TestCronStatusWithoutRun asks for the status before Run and after it returned: the caller holds the schedules
// for that time, and Next is the spec's next activation.
func TestCronStatusWithoutRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	clk := clockwork.NewFakeClockAt(time.Date(2026, 5, 4, 10, 0, 0, 0, time.UTC))
	sched := warmer.ScheduleConfig{Name: f.prefix + "daily", Spec: "CRON_TZ=UTC 0 3 * * *", Keyspace: "items",
		IDs: warmer.SliceIDs([]string{"1"})}
	d := newCronDaemons(t, f, clk, 1, nil, sched)[0]
	want := time.Date(2026, 5, 5, 3, 0, 0, 0, time.UTC)
	check := func(when string) {
		t.Helper()
		st, err := d.c.Status(context.Background())
		if err != nil {
			t.Fatalf("%s: Status: %v", when, err)
		}
		if len(st) != 1 || st[0].Name != sched.Name || !st[0].Next.Equal(want) {
			t.Errorf("%s: status = %+v, want %q next at %v", when, st, sched.Name, want)
		}
	}
	check("before Run")
	stop := runCrons(t, []*cronDaemon{d})
	check("while Run runs")
	stop()
	check("after Run returned")
}
