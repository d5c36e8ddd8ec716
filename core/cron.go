package core

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Cron is a parsed cron expression (SPEC §8a): five fields — minute
// (0-59), hour (0-23), day of month (1-31), month (1-12 or jan-dec), day of
// week (0-7 or sun-sat, 0 and 7 both Sunday) — each "*", a value, a range
// "a-b", a step "*/n", "a-b/n" or "a/n", or a comma-separated list of them;
// or one of the macros @yearly (@annually), @monthly, @weekly, @daily
// (@midnight), @hourly. As in Vixie cron, when both day fields are
// restricted (neither starts with "*") a day matches if either does.
type Cron struct {
	minute, hour, dom, month, dow uint64 // bit i set: value i matches
	domStar, dowStar              bool
}

// MaxCronBytes bounds a cron expression (SPEC §12).
const MaxCronBytes = 256

var cronMacros = map[string]string{
	"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
	"@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}

var (
	monthNames = []string{"jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"}
	dowNames   = []string{"sun", "mon", "tue", "wed", "thu", "fri", "sat"}
)

// ParseCron parses a cron expression; the error names the field at fault.
func ParseCron(expr string) (Cron, error) {
	if len(expr) > MaxCronBytes {
		return Cron{}, fmt.Errorf("cron expression is %d bytes, at most %d", len(expr), MaxCronBytes)
	}
	s := strings.TrimSpace(expr)
	if strings.HasPrefix(s, "@") {
		m, ok := cronMacros[strings.ToLower(s)]
		if !ok {
			return Cron{}, fmt.Errorf("unknown cron macro %s (want @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)", Quote(s))
		}
		s = m
	}
	f := strings.Fields(s)
	if len(f) != 5 {
		return Cron{}, fmt.Errorf("cron expression %s has %d fields, want 5 (minute hour day-of-month month day-of-week) or a macro such as @hourly", Quote(expr), len(f))
	}
	var c Cron
	var err error
	spec := []struct {
		name    string
		lo, hi  int
		names   []string
		nameLo  int
		out     *uint64
		starOut *bool
	}{
		{"minute", 0, 59, nil, 0, &c.minute, nil},
		{"hour", 0, 23, nil, 0, &c.hour, nil},
		{"day-of-month", 1, 31, nil, 0, &c.dom, &c.domStar},
		{"month", 1, 12, monthNames, 1, &c.month, nil},
		{"day-of-week", 0, 7, dowNames, 0, &c.dow, &c.dowStar},
	}
	for i, sp := range spec {
		*sp.out, err = parseCronField(f[i], sp.lo, sp.hi, sp.names, sp.nameLo)
		if err != nil {
			return Cron{}, fmt.Errorf("cron %s field %s: %w", sp.name, Quote(f[i]), err)
		}
		if sp.starOut != nil {
			*sp.starOut = strings.HasPrefix(f[i], "*")
		}
	}
	if c.dow&(1<<7) != 0 {
		c.dow |= 1 // 7 is Sunday too
	}
	if c.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC), nil).IsZero() {
		return Cron{}, fmt.Errorf("cron expression %s never fires (no such date)", Quote(expr))
	}
	return c, nil
}

func parseCronField(f string, lo, hi int, names []string, nameLo int) (uint64, error) {
	var bits uint64
	num := func(s string) (int, error) {
		for i, n := range names {
			if strings.EqualFold(s, n) {
				return i + nameLo, nil
			}
		}
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%s is not a value in %d-%d", Quote(s), lo, hi)
		}
		return n, nil
	}
	for _, part := range strings.Split(f, ",") {
		rng, stepStr, hasStep := strings.Cut(part, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepStr)
			if err != nil || n < 1 || n > hi {
				return 0, fmt.Errorf("step %s is not in 1-%d", Quote(stepStr), hi)
			}
			step = n
		}
		a, b := lo, hi
		switch {
		case rng == "*":
		case strings.Contains(rng, "-"):
			x, y, _ := strings.Cut(rng, "-")
			var err error
			if a, err = num(x); err != nil {
				return 0, err
			}
			if b, err = num(y); err != nil {
				return 0, err
			}
			if a > b {
				return 0, fmt.Errorf("range %s runs backwards", Quote(rng))
			}
		default:
			var err error
			if a, err = num(rng); err != nil {
				return 0, err
			}
			if hasStep {
				b = hi // "a/n": from a to the end
			} else {
				b = a
			}
		}
		for v := a; v <= b; v += step {
			bits |= 1 << v
		}
	}
	return bits, nil
}

// matches reports whether wall (a wall-clock reading, in UTC form) is a
// fire time of c.
func (c Cron) matches(wall time.Time) bool {
	return c.minute&(1<<wall.Minute()) != 0 && c.hour&(1<<wall.Hour()) != 0 &&
		c.month&(1<<int(wall.Month())) != 0 && c.dayMatches(wall)
}

func (c Cron) dayMatches(wall time.Time) bool {
	d := c.dom&(1<<wall.Day()) != 0
	w := c.dow&(1<<int(wall.Weekday())) != 0
	if !c.domStar && !c.dowStar {
		return d || w
	}
	return d && w
}

// ZoneSpan says that from From on (until the next span's From) a
// schedule's wall clock is UTC plus Offset seconds. The adapter resolves a
// named time zone into spans (SPEC §8a); the core knows no zone database.
type ZoneSpan struct {
	From   time.Time
	Offset int
}

// MaxZoneSpans bounds a schedule's zone spans (SPEC §12).
const MaxZoneSpans = 64

// CheckZoneSpans checks spans: at most MaxZoneSpans, From strictly
// increasing, offsets whole minutes within ±18 h.
func CheckZoneSpans(spans []ZoneSpan) error {
	if len(spans) > MaxZoneSpans {
		return fmt.Errorf("time zone has %d offset spans, at most %d", len(spans), MaxZoneSpans)
	}
	for i, sp := range spans {
		if sp.Offset%60 != 0 || sp.Offset < -18*3600 || sp.Offset > 18*3600 {
			return fmt.Errorf("time zone offset %ds is not whole minutes within ±18h", sp.Offset)
		}
		if i > 0 && !sp.From.After(spans[i-1].From) {
			return fmt.Errorf("time zone offset spans are not in time order")
		}
	}
	return nil
}

// offsetAt is the offset in effect at instant t: the last span whose From
// is not after t, else the first span's (none: UTC).
func offsetAt(spans []ZoneSpan, t time.Time) int {
	off := 0
	for i, sp := range spans {
		if i == 0 || !sp.From.After(t) {
			off = sp.Offset
		} else {
			break
		}
	}
	return off
}

// cronHorizon bounds the search for the next fire time: a matching date
// recurs within 8 years (29 February across a skipped leap year).
const cronHorizonYears = 9

// Next returns the first fire time strictly after the instant after, or
// the zero time when there is none within nine years. A fire time is an
// instant whose wall clock, under the offset spans in effect at that
// instant, matches c: a wall time skipped by a forward shift does not fire
// that day, one repeated by a backward shift fires each time it occurs
// (SPEC §8a).
func (c Cron) Next(after time.Time, spans []ZoneSpan) time.Time {
	start := after.UTC().Truncate(time.Minute).Add(time.Minute)
	i := 0
	for i+1 < len(spans) && !spans[i+1].From.After(start) {
		i++
	}
	for {
		off := 0
		if len(spans) > 0 {
			off = spans[i].Offset
		}
		cand := c.firstFrom(start, off)
		if i+1 >= len(spans) || cand.IsZero() || cand.Before(spans[i+1].From) {
			return cand
		}
		i++
		start = ceilMinute(spans[i].From)
	}
}

func ceilMinute(t time.Time) time.Time {
	u := t.UTC().Truncate(time.Minute)
	if u.Before(t) {
		u = u.Add(time.Minute)
	}
	return u
}

// firstFrom returns the first minute-aligned instant at or after t whose
// wall clock at offset off (seconds east of UTC) matches c.
func (c Cron) firstFrom(t time.Time, off int) time.Time {
	d := time.Duration(off) * time.Second
	w := t.UTC().Add(d) // the wall clock, in UTC form
	limit := w.Year() + cronHorizonYears
	for w.Year() <= limit {
		switch {
		case c.month&(1<<int(w.Month())) == 0:
			w = time.Date(w.Year(), w.Month()+1, 1, 0, 0, 0, 0, time.UTC)
		case !c.dayMatches(w):
			w = time.Date(w.Year(), w.Month(), w.Day()+1, 0, 0, 0, 0, time.UTC)
		case c.hour&(1<<w.Hour()) == 0:
			w = time.Date(w.Year(), w.Month(), w.Day(), w.Hour()+1, 0, 0, 0, time.UTC)
		case c.minute&(1<<w.Minute()) == 0:
			w = w.Add(time.Minute)
		default:
			return w.Add(-d)
		}
	}
	return time.Time{}
}
