package wire

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tether-run/tether/core"
)

// TestLargestDispatchFits: a dispatch at core.MaxDispatchBytes whose every
// byte needs an escape still encodes within MaxFrame, so the core's bound
// at submit means no grant can produce a frame the driver cannot send
// (SPEC §12). Both shapes are tried: one large value, and the most
// variables a run may declare, each as small as possible.
func TestLargestDispatchFits(t *testing.T) {
	name := strings.Repeat("n", core.MaxNameLength)
	base := core.Dispatch{Lease: math.MaxUint64, Run: "run-18446744073709551615",
		Step:    core.StepID("run-18446744073709551615/" + name + "[999]"),
		Command: strings.Repeat("\x01", core.MaxCommandLength), Writes: true, Timeout: time.Duration(math.MaxInt64), Attempt: math.MaxInt}
	budget := core.MaxDispatchBytes - len(base.Command)

	oneValue := base
	oneValue.Env = map[string]string{"\x02": strings.Repeat("<", budget-2)} // "K=V" is 2 bytes plus the value

	manyVars := base
	manyVars.Env = map[string]string{}
	for i := 0; len(manyVars.Env) < 2*core.MaxEnvVars+1; i++ {
		k := string([]byte{byte(1 + i%31), byte(1 + i/31%31)})
		manyVars.Env[k] = ""
		budget -= len(k) + 1
	}
	manyVars.Env["\x1f\x1f\x1f"] = strings.Repeat("\x1e", budget-4)

	for _, c := range []struct {
		name string
		d    core.Dispatch
	}{{"one value", oneValue}, {"many variables", manyVars}} {
		n := len(c.d.Command)
		for k, v := range c.d.Env {
			n += len(k) + 1 + len(v)
		}
		if n != core.MaxDispatchBytes {
			t.Fatalf("%s: test dispatch carries %d bytes, want exactly %d", c.name, n, core.MaxDispatchBytes)
		}
		b, err := Encode(c.d)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(b) > MaxFrame {
			t.Fatalf("%s: %d bytes, over MaxFrame %d", c.name, len(b), MaxFrame)
		}
		t.Logf("%s: %d bytes at the limit encode to %d (MaxFrame %d)", c.name, n, len(b), MaxFrame)
	}
}
