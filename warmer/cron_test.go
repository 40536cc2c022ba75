package warmer_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/keepwarm/keepwarm/internal/runs"
	"github.com/keepwarm/keepwarm/internal/testenv"
	"github.com/keepwarm/keepwarm/migrations"
	"github.com/keepwarm/keepwarm/warmer"
)

// TestCronDST walks a schedule's activations over the 2026 DST changes in America/New_York with the schedule's
// own clock (Next), and claims each one as the daemon would: every local time runs at most once, the local time
// that spring-forward skips does not run, and the one that fall-back repeats runs once.
func TestCronDST(t *testing.T) {
	rdb := testenv.Redis(t)
	prefix := testenv.Prefix(t, rdb)
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		spec  string
		from  time.Time
		days  int
		want  int    // claims won over those days
		check string // what the case shows
	}{
		{"CRON_TZ=America/New_York 30 2 * * *", time.Date(2026, 3, 6, 12, 0, 0, 0, loc), 4, 3,
			"02:30 does not exist on 2026-03-08: no run that day"},
		{"CRON_TZ=America/New_York 30 1 * * *", time.Date(2026, 10, 30, 12, 0, 0, 0, loc), 4, 4,
			"01:30 happens twice on 2026-11-01: one run"},
		{"CRON_TZ=America/New_York 30 2 * * *", time.Date(2026, 10, 30, 12, 0, 0, 0, loc), 4, 4,
			"02:30 on 2026-11-01 happens once: one run"},
	}
	for i, tt := range tests {
		t.Run(tt.check, func(t *testing.T) {
			spec, err := warmer.CronParser.Parse(tt.spec)
			if err != nil {
				t.Fatal(err)
			}
			name := prefix + string(rune('a'+i))
			won, fired := 0, 0
			seen := map[string]int{}
			end := tt.from.Add(time.Duration(tt.days) * 24 * time.Hour)
			for at := spec.Next(tt.from); at.Before(end); at = spec.Next(at) {
				fired++
				local := at.In(loc).Format("2006-01-02 15:04")
				seen[local]++
				ok, err := rdb.SetNX(context.Background(), warmer.ClaimKey(name, at.In(loc)), "test", time.Minute).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					won++
				}
			}
			if won != tt.want {
				t.Errorf("%s from %s: %d runs (robfig fired %d times: %v), want %d", tt.spec, tt.from, won, fired, seen, tt.want)
			}
		})
	}
}

// TestCronRunsOncePerTimeAcrossDaemons runs one schedule on two daemons (separate Redis clients and warmers)
// and checks through keepwarm.warmup_runs that each scheduled time ran once.
func TestCronRunsOncePerTimeAcrossDaemons(t *testing.T) {
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
	cfg := f.config()
	cfg.TTL, cfg.RefreshAhead = time.Minute, 10*time.Second // the written keys outlive the test
	var crons []*warmer.Cron
	for i := 0; i < 2; i++ {
		rdb := testenv.Redis(t)
		w, err := warmer.New(rdb, warmer.Config{Keyspaces: []warmer.KeyspaceConfig{cfg}})
		if err != nil {
			t.Fatal(err)
		}
		c, err := warmer.NewCron(w, runs.New(pool, "daemon-"+string(rune('a'+i))), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Update([]warmer.ScheduleConfig{sched}); err != nil {
			t.Fatal(err)
		}
		crons = append(crons, c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	for _, c := range crons {
		go func() {
			c.Run(ctx)
			done <- struct{}{}
		}()
	}
	time.Sleep(5500 * time.Millisecond) // two or three even seconds
	cancel()
	<-done
	<-done
	var n, hosts int
	var written int64
	err := pool.QueryRow(context.Background(), `select count(*), count(distinct host), coalesce(sum(written), 0)
		from keepwarm.warmup_runs where name = $1 and status = 'ok'`, name).Scan(&n, &hosts, &written)
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 || n > 3 {
		t.Fatalf("%d ok runs in 5.5 s of */2 on two daemons, want 2 or 3 (one per scheduled time)", n)
	}
	if written != int64(3*n) {
		t.Errorf("written %d keys over %d runs, want %d", written, n, 3*n)
	}
	if v := f.rdb.Exists(context.Background(), f.key("1"), f.key("2"), f.key("3")).Val(); v != 3 {
		t.Errorf("%d of 3 keys written", v)
	}
	st := crons[0].Status()
	if len(st) != 1 || st[0].Next.IsZero() {
		t.Errorf("status = %+v, want one schedule with a next run", st)
	}
}

func TestCronRejectsBadSchedules(t *testing.T) {
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
	}{
		{"bad spec", warmer.ScheduleConfig{Name: "x", Spec: "61 * * * *", Keyspace: "items", IDs: ids}},
		{"unknown keyspace", warmer.ScheduleConfig{Name: "x", Spec: "@daily", Keyspace: "nope", IDs: ids}},
		{"no ids", warmer.ScheduleConfig{Name: "x", Spec: "@daily", Keyspace: "items"}},
	} {
		if err := c.Update([]warmer.ScheduleConfig{tt.s}); err == nil {
			t.Errorf("%s: no error", tt.name)
		}
	}
}

// TestCronReloadNeverDuplicatesARun reloads a schedule with a new spec while its slow run is in progress: the
// new entry must not start a second run of the same schedule beside it.
func TestCronReloadNeverDuplicatesARun(t *testing.T) {
	f := newFixture(t, 3)
	f.src.src = f.source(t, "select id, body from "+f.table+", pg_sleep(1.2) where id = any($1)")
	pool := testenv.Postgres(t)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	if err := migrations.Up(context.Background(), db, io.Discard); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	name := f.prefix + "slow"
	t.Cleanup(func() { pool.Exec(context.Background(), "delete from keepwarm.warmup_runs where name = $1", name) })
	cfg := f.config()
	cfg.LockTTL, cfg.StatementTimeout = 5*time.Second, 3*time.Second
	cfg.TTL = 10 * time.Second // the lead must fit the 3 s statement timeout
	w := newWarmer(t, f, cfg)
	c, err := warmer.NewCron(w, runs.New(pool, "reloader"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	sched := warmer.ScheduleConfig{Name: name, Spec: "* * * * * *", Keyspace: "items", IDs: warmer.SliceIDs([]string{"1"})}
	if err := c.Update([]warmer.ScheduleConfig{sched}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		c.Run(ctx)
		close(done)
	}()
	time.Sleep(1500 * time.Millisecond) // the first run is under way
	sched.Spec = "*/1 * * * * *"        // same times, new spec: a new cron entry
	if err := c.Update([]warmer.ScheduleConfig{sched}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	cancel()
	<-done
	rows, err := pool.Query(context.Background(), `select started_at, coalesce(finished_at, now()) from keepwarm.warmup_runs
		where name = $1 order by started_at`, name)
	if err != nil {
		t.Fatal(err)
	}
	var prevEnd time.Time
	n := 0
	for rows.Next() {
		var s, e time.Time
		if err := rows.Scan(&s, &e); err != nil {
			t.Fatal(err)
		}
		if n > 0 && s.Before(prevEnd) {
			t.Errorf("run %d started at %v, before the previous run ended at %v: a duplicate run", n, s, prevEnd)
		}
		prevEnd = e
		n++
	}
	if n < 2 {
		t.Errorf("%d runs in 4.5 s of a 1.2 s warmup scheduled every second, want >= 2", n)
	}
}
