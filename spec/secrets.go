package spec

import (
	"fmt"

	"github.com/tether-run/tether/core"
)

// PropSecretScoped names the secrets' access property (SPEC §14a): a secret
// read the core admits is made under a lease that is current and held by
// the reading worker (LeaseHeldBy), and the step of that lease declares
// the secret. So a step never reads a secret it did not name, nor after
// its lease ended.
const PropSecretScoped = "SecretScoped"

// SecretDecided checks the core's answer to worker w's read of secret name
// under lease l, asked of the state after the last recorded batch;
// declares says whether a step declares the name (the workload's own
// record of what it submitted, never the core's).
func (c *Checker) SecretDecided(w core.WorkerID, l core.LeaseID, name string, declares func(core.StepID, string) bool, a core.DataAnswer) *Violation {
	c.checks++
	if a.Refusal != core.WriteAdmitted {
		return nil
	}
	ow, cur := c.current[l]
	switch {
	case !c.LeaseHeldBy(w, l):
		return &Violation{Invariant: PropSecretScoped, Detail: fmt.Sprintf("worker %s read secret %s under lease %d, which is not current and its own", w, name, l)}
	case !cur || !declares(ow.step, name):
		return &Violation{Invariant: PropSecretScoped, Detail: fmt.Sprintf("worker %s read secret %s under lease %d of step %s, which does not declare it", w, name, l, ow.step)}
	}
	return nil
}
