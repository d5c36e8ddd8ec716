package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// bruteNext is the reference for Cron.Next: every minute after `after`, in
// turn, under the offset in effect at that minute, up to horizon.
func bruteNext(expr string, after time.Time, spans []ZoneSpan, horizon time.Duration) (time.Time, bool) {
	match := refMatcher(expr)
	t := after.UTC().Truncate(time.Minute).Add(time.Minute)
	for end := t.Add(horizon); t.Before(end); t = t.Add(time.Minute) {
		if match(t.Add(time.Duration(offsetAt(spans, t)) * time.Second)) {
			return t, true
		}
	}
	return time.Time{}, false
}

// refMatcher is a second, naive reading of a cron expression (numbers,
// the few names the generator uses, the macros it draws): each field is
// read into the set of values some part of it admits.
func refMatcher(expr string) func(time.Time) bool {
	if m, ok := map[string]string{"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
		"@weekly": "0 0 * * 0", "@monthly": "0 0 1 * *"}[expr]; ok {
		expr = m
	}
	f := strings.Fields(strings.NewReplacer("jan", "1", "mar", "3", "sat", "6", "sun", "0").Replace(expr))
	set := func(field string, lo, hi int) []bool {
		ok := make([]bool, hi+1)
		for _, part := range strings.Split(field, ",") {
			a, b, step := lo, hi, 1
			rng, st, has := strings.Cut(part, "/")
			if has {
				fmt.Sscan(st, &step)
			}
			if rng != "*" {
				if x, y, isRange := strings.Cut(rng, "-"); isRange {
					fmt.Sscan(x, &a)
					fmt.Sscan(y, &b)
				} else {
					fmt.Sscan(rng, &a)
					if !has {
						b = a
					}
				}
			}
			for v := lo; v <= hi; v++ {
				if v >= a && v <= b && (v-a)%step == 0 {
					ok[v] = true
				}
			}
		}
		return ok
	}
	mins, hours, doms, months, dows := set(f[0], 0, 59), set(f[1], 0, 23), set(f[2], 1, 31), set(f[3], 1, 12), set(f[4], 0, 7)
	either := f[2][0] != '*' && f[4][0] != '*'
	return func(w time.Time) bool {
		dow := int(w.Weekday())
		dowOK := dows[dow] || (dow == 0 && dows[7])
		day := doms[w.Day()] && dowOK
		if either {
			day = doms[w.Day()] || dowOK
		}
		return mins[w.Minute()] && hours[w.Hour()] && months[int(w.Month())] && day
	}
}

func genCronField(lo, hi int) *rapid.Generator[string] {
	return rapid.Custom(func(t *rapid.T) string {
		n := rapid.IntRange(1, 3).Draw(t, "parts")
		var parts []string
		for range n {
			a := rapid.IntRange(lo, hi).Draw(t, "a")
			b := rapid.IntRange(a, hi).Draw(t, "b")
			switch rapid.IntRange(0, 5).Draw(t, "kind") {
			case 0:
				parts = append(parts, "*")
			case 1:
				parts = append(parts, fmt.Sprint(a))
			case 2:
				parts = append(parts, fmt.Sprintf("%d-%d", a, b))
			case 3:
				parts = append(parts, fmt.Sprintf("*/%d", rapid.IntRange(1, hi).Draw(t, "step")))
			case 4:
				parts = append(parts, fmt.Sprintf("%d-%d/%d", a, b, rapid.IntRange(1, hi).Draw(t, "step")))
			default:
				parts = append(parts, fmt.Sprintf("%d/%d", a, rapid.IntRange(1, hi).Draw(t, "step")))
			}
		}
		return strings.Join(parts, ",")
	})
}

// TestCronNextMatchesBruteForce: Next equals a minute-by-minute search,
// with and without zone spans (forward and backward shifts). A bug in a
// field's carry (day overflow, month roll), in the day-of-month/day-of-week
// rule or in the span walk makes the two differ.
func TestCronNextMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var expr string
		if rapid.IntRange(0, 9).Draw(t, "macro") == 0 {
			expr = rapid.SampledFrom([]string{"@hourly", "@daily", "@weekly", "@monthly", "@midnight"}).Draw(t, "m")
		} else {
			// Dense minute and hour fields keep the reference's search short.
			expr = strings.Join([]string{
				genCronField(0, 59).Draw(t, "min"), genCronField(0, 23).Draw(t, "hour"),
				rapid.SampledFrom([]string{"*", "1-15", "*/2", "13,28", "31"}).Draw(t, "dom"),
				rapid.SampledFrom([]string{"*", "1-6", "*/3", "2", "jan-mar"}).Draw(t, "month"),
				rapid.SampledFrom([]string{"*", "1-5", "0", "7", "sat,sun", "*/2"}).Draw(t, "dow"),
			}, " ")
		}
		c, err := ParseCron(expr)
		if err != nil {
			t.Skip(err)
		}
		after := time.Unix(rapid.Int64Range(946684800, 4102444800).Draw(t, "after"), 0).UTC()
		var spans []ZoneSpan
		if n := rapid.IntRange(0, 4).Draw(t, "spans"); n > 0 {
			at := after.Add(-time.Duration(rapid.IntRange(0, 48*60).Draw(t, "lead")) * time.Minute)
			for range n {
				spans = append(spans, ZoneSpan{From: at, Offset: 60 * rapid.IntRange(-14*60, 14*60).Draw(t, "off")})
				at = at.Add(time.Duration(rapid.IntRange(1, 72*60).Draw(t, "gap"))*time.Minute + time.Duration(rapid.IntRange(0, 59).Draw(t, "sec"))*time.Second)
			}
		}
		const horizon = 120 * 24 * time.Hour
		want, ok := bruteNext(expr, after, spans, horizon)
		got := c.Next(after, spans)
		if ok && !got.Equal(want) {
			t.Fatalf("%q after %s spans %v: Next %s, brute force %s", expr, after, spans, got, want)
		}
		if !ok && !got.IsZero() && got.Before(after.Add(horizon)) {
			t.Fatalf("%q after %s: Next %s, brute force finds none before %s", expr, after, got, after.Add(horizon))
		}
	})
}

func TestParseCronErrors(t *testing.T) {
	for expr, want := range map[string]string{
		"* * * *":        "has 4 fields",
		"60 * * * *":     "minute field",
		"* 24 * * *":     "hour field",
		"* * 0 * *":      "day-of-month field",
		"* * * 13 *":     "month field",
		"* * * * 8":      "day-of-week field",
		"5-1 * * * *":    "backwards",
		"*/0 * * * *":    "step",
		"@fortnightly":   "unknown cron macro",
		"0 0 30 2 *":     "never fires",
		"0 0 31 apr,jun": "has 4 fields",
	} {
		if _, err := ParseCron(expr); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseCron(%q) = %v, want an error with %q", expr, err, want)
		}
	}
	for _, expr := range []string{"0 9 * * mon-fri", "*/15 * * * *", "0 0 29 2 *", "@annually", "0 12 1,15 * sun"} {
		if _, err := ParseCron(expr); err != nil {
			t.Errorf("ParseCron(%q): %v", expr, err)
		}
	}
}
