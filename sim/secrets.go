package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tether-run/tether/core"
)

// The simulated secrets (SPEC §14a). A step of the random workload declares
// one secret, by a rule of its name (stepSecret), so nothing random is
// drawn for it; each process then asks the data plane for one secret of
// simSecrets, its own or another, at a random time of its run (the data
// plane's own random stream). Each read reaches the orchestrator after the
// network's delay and is decided by the core's CheckSecret query; every
// admitted read is checked against the Checker's view of leases and the
// workload's own record of declarations (spec.PropSecretScoped). Reads
// share the zombies of the data plane: a process that runs on after its
// lease ended still asks.

// simSecrets are the secrets' names of the simulated workload.
var simSecrets = []string{"S0", "S1", "S2"}

// stepSecret is the secret step number i of a random run declares: "" for
// every third step (it declares none).
func stepSecret(i int) string {
	if i%3 == 2 {
		return ""
	}
	return simSecrets[i%len(simSecrets)]
}

// declaresSecret says whether a step of the random workload declares
// name: its name is "sN" or "sN[k]" (a forEach instance).
func declaresSecret(step core.StepID, name string) bool {
	s := string(step)
	s = s[strings.IndexByte(s, '/')+1:]
	if b, _, ok := strings.Cut(s, "["); ok {
		s = b
	}
	n, err := strconv.Atoi(strings.TrimPrefix(s, "s"))
	return err == nil && strings.HasPrefix(s, "s") && name != "" && stepSecret(n) == name
}

// SecretStats says how many secret reads a run made and how they were
// answered.
type SecretStats struct {
	Reads, Admitted, Undeclared, Fenced int
}

func (s *SecretStats) add(o SecretStats) {
	s.Reads += o.Reads
	s.Admitted += o.Admitted
	s.Undeclared += o.Undeclared
	s.Fenced += o.Fenced
}

func (s SecretStats) String() string {
	return fmt.Sprintf("secret reads: %d (admitted %d, not declared %d, fenced %d)", s.Reads, s.Admitted, s.Undeclared, s.Fenced)
}

// secretRead schedules a process's one secret read, at a random time of
// its run.
func (w *world) secretRead(wn *workerNode, p *proc, dur time.Duration) {
	d := w.dataState()
	name := simSecrets[d.r.IntN(len(simSecrets))]
	off := time.Duration(d.r.Int64N(int64(dur) + 1))
	gen := wn.gen
	w.after(off, evProc, wn.idx, nil, "secret read", func() {
		if wn.gen != gen || p.done || !wn.alive || w.now.Before(wn.pausedUntil) {
			return
		}
		lk := &wn.link
		cred := wn.m.Credential()
		if lk.cutUp || lk.clogUntil.After(w.now) || cred == "" {
			return // lost: a read is not retried here
		}
		delay := time.Duration(float64(w.opt.DelayMin+time.Duration(d.r.Int64N(int64(w.opt.DelayMax-w.opt.DelayMin)+1))) * lk.scale)
		lease := p.lease
		w.after(delay, evToOrch, wn.idx, nil, fmt.Sprintf("secret read lease=%d %s", lease, name), func() {
			w.arriveSecretRead(wn.id, cred, lease, name)
		})
	})
}

// arriveSecretRead is a secret read reaching the orchestrator: the core's
// query decides it, and the decision is checked.
func (w *world) arriveSecretRead(reader core.WorkerID, cred string, lease core.LeaseID, name string) {
	if !w.orch.up || w.orchFrozen() || w.failure != nil {
		return
	}
	d := w.dataState()
	a := w.orch.o.CheckSecret(w.onow(), cred, lease, name, false)
	d.stats.Secrets.Reads++
	switch a.Refusal {
	case core.WriteAdmitted:
		d.stats.Secrets.Admitted++
	case core.RefusedSecretNotDeclared:
		d.stats.Secrets.Undeclared++
	default:
		d.stats.Secrets.Fenced++
	}
	if v := w.chk.SecretDecided(reader, lease, name, declaresSecret, a); v != nil {
		w.fail(v.Invariant, v.Detail)
	}
}
