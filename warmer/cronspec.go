package warmer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronParser is the one parser of [[schedule]] specs: robfig/cron v3 syntax with optional leading seconds,
// descriptors (@daily, @every 10m) and a CRON_TZ=Zone (or TZ=Zone) prefix. Use ParseCron, which guards it.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow |
	cron.Descriptor)

// CronHorizon is how far ahead ParseCron looks for a spec's first activation: robfig/cron's own search limit
// (five years). A spec with none inside it ("0 0 30 2 *", the 30th of February) never fires and is rejected.
const CronHorizon = 5 * 365 * 24 * time.Hour

// cronReference is the instant ParseCron searches from for the first activation. Any instant works for the
// "never fires" test, since every spec that fires at all fires within four years (29 February); a fixed one
// keeps ParseCron a pure function of its input.
var cronReference = time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)

// CronSchedule is one parsed [[schedule]] spec: the times it fires and the zone its wall-clock fields are in.
// Build it with ParseCron. It is immutable and safe for concurrent use.
type CronSchedule struct {
	text  string
	sched cron.Schedule
	loc   *time.Location // the zone of the spec's fields (CRON_TZ=, else time.Local); UTC for @every
}

// ParseCron parses spec ("CRON_TZ=Europe/Berlin 30 2 * * *", "0 */5 * * * *", "@every 10m"). It never panics:
// robfig/cron's parser panics on some inputs (a "TZ=UTC" prefix with no fields), and that is recovered into
// an error. It also rejects a spec that has no activation within CronHorizon, such as "0 0 30 2 *". The error
// text is ready to follow a field name: `cron: "0 0 30 2 *" never fires (...)`.
func ParseCron(spec string) (*CronSchedule, error) {
	s, err := parseCronGuarded(spec)
	if err != nil {
		return nil, err
	}
	cs := &CronSchedule{text: spec, sched: s, loc: time.UTC}
	if ss, ok := s.(*cron.SpecSchedule); ok {
		cs.loc = ss.Location
		if ss.Location == nil {
			cs.loc = time.Local
		}
	}
	if cs.sched.Next(cronReference).IsZero() {
		return nil, fmt.Errorf("%q never fires (no activation within %d years; check the day of month against the month)",
			spec, int(CronHorizon/(365*24*time.Hour)))
	}
	return cs, nil
}

// minGapFirings is how many consecutive activations MinInterval looks at.
const minGapFirings = 512

// MinInterval returns the shortest time between two consecutive activations: the delay of an "@every" spec
// (robfig/cron rounds it up to 1 s, so "@every 0s" fires every second), else the smallest gap among the first
// 512 activations after a fixed instant, which covers a spec's densest field ("*/5 * * * * *": 5s;
// "0,30 0 3 * * *": 30s). Config uses it to refuse schedules that would run a warmup every few seconds.
func (s *CronSchedule) MinInterval() time.Duration {
	if d, ok := s.sched.(cron.ConstantDelaySchedule); ok {
		return d.Delay
	}
	shortest := time.Duration(0)
	t := s.sched.Next(cronReference)
	for range minGapFirings {
		next := s.sched.Next(t)
		if next.IsZero() {
			break
		}
		if g := next.Sub(t); shortest == 0 || g < shortest {
			shortest = g
		}
		t = next
	}
	return shortest
}

func parseCronGuarded(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			s, err = nil, fmt.Errorf("%q cannot be parsed (%v)", spec, r)
		}
	}()
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("is empty")
	}
	// robfig/cron slices out the zone up to the first space; without fields after it, it panics. Say what is
	// missing instead of relying only on the recover above.
	if t := strings.TrimSpace(spec); strings.HasPrefix(t, "TZ=") || strings.HasPrefix(t, "CRON_TZ=") {
		if !strings.Contains(t, " ") {
			return nil, fmt.Errorf("%q has a time zone but no schedule fields after it (e.g. \"%s 0 3 * * *\")", spec, t)
		}
	}
	s, err = cronParser.Parse(spec)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", spec, err)
	}
	return s, nil
}

// String returns the spec as written.
func (s *CronSchedule) String() string { return s.text }

// Location returns the zone of the spec's wall-clock fields.
func (s *CronSchedule) Location() *time.Location { return s.loc }

// Next returns the first activation strictly after t, in the schedule's zone, or the zero time if there is
// none within CronHorizon.
func (s *CronSchedule) Next(t time.Time) time.Time {
	n := s.sched.Next(t)
	if n.IsZero() {
		return n
	}
	return n.In(s.loc)
}

// wall returns t's wall-clock time in the schedule's zone, written as a UTC time with the same fields: the
// identity of "the 02:30 run of 2025-10-26" whichever of the two 02:30 instants of that day t is.
func (s *CronSchedule) wall(t time.Time) time.Time {
	t = t.In(s.loc)
	y, mo, d := t.Date()
	h, mi, sec := t.Clock()
	return time.Date(y, mo, d, h, mi, sec, 0, time.UTC)
}

// starBit marks a field written as "*" in robfig/cron's SpecSchedule bit sets.
const starBit = 1 << 63

// gap looks for a daylight-saving jump forward in the schedule's zone in (after, before) that skips a local
// time the spec names. It returns the first skipped wall-clock time (as wall returns it), and the instant
// the gap ends (the first valid time after it). Only specs with fixed hours are considered: "*/30 * * * *"
// fires at the next half hour anyway, as in cronie, which also runs only fixed-time jobs after a gap.
func (s *CronSchedule) gap(after, before time.Time) (skipped, end time.Time, ok bool) {
	ss, isSpec := s.sched.(*cron.SpecSchedule)
	if !isSpec || ss.Hour&starBit != 0 {
		return time.Time{}, time.Time{}, false
	}
	t := after.In(s.loc)
	for i := 0; i < 32; i++ { // a few changes a year, CronHorizon ahead at most
		_, zoneEnd := t.ZoneBounds()
		if zoneEnd.IsZero() || !zoneEnd.Before(before) {
			return time.Time{}, time.Time{}, false
		}
		_, offBefore := t.Zone()
		_, offAfter := zoneEnd.Zone()
		if jump := offAfter - offBefore; jump > 0 {
			first := zoneEnd.Add(time.Duration(offBefore) * time.Second).UTC() // the wall clock reading at the jump
			first = time.Date(first.Year(), first.Month(), first.Day(), first.Hour(), first.Minute(), first.Second(), 0, time.UTC)
			for sec := 0; sec < jump; sec++ {
				w := first.Add(time.Duration(sec) * time.Second)
				if specMatches(ss, w) {
					return w, zoneEnd.In(s.loc), true
				}
			}
		}
		t = zoneEnd.In(s.loc)
	}
	return time.Time{}, time.Time{}, false
}

// specMatches reports whether the wall-clock fields of w (a UTC-written wall time) match ss.
func specMatches(ss *cron.SpecSchedule, w time.Time) bool {
	bit := func(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }
	dom, dow := bit(ss.Dom, w.Day()), bit(ss.Dow, int(w.Weekday()))
	day := dom || dow
	if ss.Dom&starBit != 0 || ss.Dow&starBit != 0 {
		day = dom && dow
	}
	return day && bit(ss.Month, int(w.Month())) && bit(ss.Hour, w.Hour()) && bit(ss.Minute, w.Minute()) &&
		bit(ss.Second, w.Second())
}
